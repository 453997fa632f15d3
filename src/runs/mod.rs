//! The run manager: ids, admission ([`admission`]: a bounded FIFO queue, a concurrency cap and
//! a memory budget), stop, retention of finished reports ([`retention`]) and the lookup of
//! reports not in memory ([`lookup`]).
//!
//! The run manager owns the memory budget, the pool's share included: the pool grows only when
//! the manager lets it, gives memory back when the manager asks, and tells the manager
//! whenever it came to hold less or a fill ended, so that a queued run starts as soon as the
//! memory it waits for is free. Every event that frees or changes the budget (a run ends, a
//! pooled container is ready, fails, is taken or expires) runs admission again.
//!
//! A run is charged the larger of its memory limit and its language's compile-stage limit,
//! since the stages run one after the other (their tmpfs working directories are memory
//! within those limits).
//!
//! Each run executes in its own tokio task, watched by a second task: if the first panics,
//! the run still ends, as `sandbox_error` (the executor's guards remove its containers).
//!
//! Several servers may share one history database (PostgreSQL): a run not in memory is
//! looked up there ([`lookup`]).
//!
//! Admission alone owns the budget: runs, the pool's ready containers, and what others hold
//! through [`RunManager::hold`] (sessions, and what is opened ahead of time, which gives way
//! through [`Ahead`]). A run carried out by whoever submits it (an execution in a session's
//! container) is a [`Job`]: queued, charged and reported like any run. Here: [`RunManager`]
//! whole; beside it its vocabulary ([`submit`], [`lookup`], [`stats`], [`budget`]) and its
//! parts with state of their own ([`admission`], [`retention`], [`metrics`]).

pub mod admission;
mod budget;
mod lookup;
pub mod metrics;
pub mod retention;
mod stats;
mod submit;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::config::Config;
use crate::contract::{RequestError, RunRequest, ValidRequest};
use crate::executor::pool::{floors_for, shapes_of, Change, Shape};
use crate::executor::{new_run_id, parallelism, Call, Executor};
use crate::history::{now_ms, Claimed, History, NewRun, Room, SharedQueue, Submitted};
use crate::live::Feed;
use crate::registry::Registry;
use crate::report::{RunReport, Status};
use admission::{Admission, Next, Policy, Refusal, Ticket};
pub use budget::{check_budget, execution_charge, memory_charge, run_charge, Ahead, BudgetError};
pub use lookup::LookupError;
use lookup::{ELSEWHERE_POLL, NO_LIMITS, UNKNOWN_GRACE, UNKNOWN_POLL};
pub use metrics::Metrics;
use retention::Retention;
pub use retention::{report_bytes, REPORT_OVERHEAD_BYTES};
pub use stats::{PoolSnapshot, SessionCounts, Stats};
pub use submit::{Accepted, Job, Start, SubmitError, Work};

/// How long `stop` waits for a running run's containers to be killed and removed.
const STOP_WAIT: Duration = Duration::from_secs(120);
/// How often finished reports past their retention are dropped.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the pool is checked for containers to replace or add.
const POOL_INTERVAL: Duration = Duration::from_millis(500);
/// The message of a run stopped before it left the queue.
const QUEUED_STOP: &str = "stopped while waiting in the queue; it never started";
/// How often an idle server looks at the shared queue when no notification came.
const QUEUE_POLL: Duration = Duration::from_secs(2);
/// How long a claimer that could not reach the shared queue waits before it tries again.
const QUEUE_RETRY: Duration = Duration::from_secs(1);

/// Where a run being queued comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Origin {
    /// Submitted here, for this server's own queue.
    New,
    /// Submitted here for the shared queue, which could not take it: it runs here.
    Taken,
    /// Claimed from the shared queue (its history row exists), after waiting there.
    Claimed { waited_ms: u64 },
}

/// What a job brings to the queue beside its request.
struct Held {
    serial: String,
    at: crate::report::SessionExecution,
    work: Box<dyn Work>,
}

/// Where an unfinished run stands, for progress notifications.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Progress {
    pub status: Status,
    /// Time since the run was accepted.
    pub elapsed: Duration,
    /// 1-based place in the queue while `queued`.
    pub queue_position: Option<usize>,
    /// Wall-clock limit of the whole run (compile and run stages).
    pub budget: Duration,
}

/// Where an unfinished run is.
enum RunState {
    Queued { request: Box<ValidRequest> },
    Running { started: Instant },
}

/// A run not finished yet.
struct Live {
    /// The report before anything happened (status `queued`).
    base: RunReport,
    /// What admission charged it (slots, memory, its serial key).
    ticket: Ticket,
    /// The containers it asked the pool for, by shape (none for a job).
    shapes: Vec<(Shape, usize)>,
    /// A job's work, until it starts.
    work: Option<Box<dyn Work>>,
    budget: Duration,
    accepted: Instant,
    state: RunState,
    cancel: CancellationToken,
    done: watch::Sender<Option<Arc<RunReport>>>,
    /// Its live events (output as it comes), ended with the report.
    feed: Arc<Feed>,
    /// Claimed from the shared queue: it starts only if its row is still this server's
    /// claim ([`SharedQueue::take`]).
    shared: bool,
    /// The final report the others wrote for it while this server's lease was judged lapsed:
    /// its report here too, whatever its task ends with ([`RunManager::fence`]).
    fenced: Option<RunReport>,
}

impl State {
    /// What this server could start now: admission's room, less what runs submitted here a
    /// moment ago and a claim in flight reserved.
    fn room(&self) -> (usize, u64) {
        let (slots, mb) = self.admission.room();
        let (rs, rm) = self
            .pending
            .values()
            .fold(self.claiming, |(s, m), (a, b)| (s + a, m + b));
        (slots.saturating_sub(rs), mb.saturating_sub(rm))
    }
}

struct State {
    live: HashMap<String, Live>,
    /// Runs submitted here to the shared queue whose insert has not answered yet, and the
    /// slots and memory each reserved here (claimed at once when there was room).
    pending: HashMap<String, (usize, u64)>,
    /// The slots and memory a claim from the shared queue in flight may fill: a run
    /// submitted meanwhile does not count on them too (it waits in the shared queue instead).
    claiming: (usize, u64),
    admission: Admission,
    retention: Retention,
}

struct Inner {
    executor: Arc<Executor>,
    registry: Arc<Registry>,
    config: Arc<Config>,
    history: Option<History>,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    /// What was opened ahead of time beside the pool, asked for memory back when a queued
    /// run needs it.
    ahead: OnceLock<Weak<dyn Ahead>>,
    /// The loops that keep the pool and the retention (ended with the manager, and at
    /// shutdown).
    tasks: Mutex<Vec<AbortOnDropHandle<()>>>,
    /// The queue shared with the other servers of a cluster (PostgreSQL), once joined.
    shared: OnceLock<SharedQueue>,
    /// The other servers of the cluster.
    peers: OnceLock<Arc<dyn Peers>>,
    /// A run this server did not hold came here (claimed), or a submission was answered.
    changed: tokio::sync::Notify,
}

/// The run manager. Cheap to clone; all clones share the same runs.
#[derive(Clone)]
pub struct RunManager {
    inner: Arc<Inner>,
}

impl RunManager {
    /// A manager running requests on `executor`. `history`, when given, gets one row per run.
    /// Must be called inside a tokio runtime (it starts the purge of expired reports).
    pub fn new(
        executor: Arc<Executor>,
        registry: Arc<Registry>,
        config: Arc<Config>,
        history: Option<History>,
    ) -> RunManager {
        let policy = Policy {
            max_concurrent_runs: config.runs.max_concurrent_runs,
            max_queued_runs: config.runs.max_queued_runs,
            memory_budget_mb: config.runs.memory_budget_mb,
        };
        let metrics = Arc::new(Metrics::default());
        let inner = Arc::new(Inner {
            executor,
            registry,
            config,
            history,
            metrics,
            ahead: OnceLock::new(),
            state: Mutex::new(State {
                live: HashMap::new(),
                pending: HashMap::new(),
                claiming: (0, 0),
                admission: Admission::new(policy),
                retention: Retention::default(),
            }),
            tasks: Mutex::new(Vec::new()),
            shared: OnceLock::new(),
            peers: OnceLock::new(),
            changed: tokio::sync::Notify::new(),
        });
        let manager = RunManager { inner };
        let weak = Arc::downgrade(&manager.inner);
        manager.inner.executor.pool().on_change(move |change| {
            if let Some(inner) = weak.upgrade() {
                let manager = RunManager { inner };
                let mut st = manager.lock();
                match change {
                    Change::Taken => manager.admit(&mut st),
                    Change::Other => manager.pump(&mut st),
                }
            }
        });
        manager.sweep_history();
        if let Some(h) = &manager.inner.history {
            let lapses = h.lapses();
            manager.own(tokio::spawn(fence_loop(
                Arc::downgrade(&manager.inner),
                lapses,
            )));
        }
        manager.own(tokio::spawn(purge_loop(Arc::downgrade(&manager.inner))));
        manager
    }

    /// A background loop of this manager: it ends when the manager is dropped or shut down
    /// (it holds the manager only weakly, so that it does not keep it alive).
    fn own(&self, task: tokio::task::JoinHandle<()>) {
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.push(AbortOnDropHandle::new(task));
    }

    /// Join a cluster's shared queue (SPEC section 15): runs submitted here from now on go to
    /// `queue`, and this server claims from it what fits its own slots and budget; `peers`
    /// answers for the runs another server claimed. Sessions' executions stay on the
    /// session's server. Called once, by `codebox serve` in a cluster.
    pub fn share_queue(&self, queue: SharedQueue, peers: Arc<dyn Peers>) {
        if self.inner.shared.set(queue.clone()).is_err() {
            return;
        }
        let _ = self.inner.peers.set(peers);
        self.own(tokio::spawn(claim_loop(Arc::downgrade(&self.inner), queue)));
    }

    fn shared(&self) -> Option<&SharedQueue> {
        self.inner.shared.get()
    }

    /// Ask `ahead` for memory back when a queued run needs it (held weakly: it may hold
    /// this manager). Called once.
    pub fn give_way_from(&self, ahead: Weak<dyn Ahead>) {
        let _ = self.inner.ahead.set(ahead);
    }

    fn retention(&self) -> Duration {
        Duration::from_secs(self.inner.config.runs.result_retention_seconds)
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.inner.config
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.inner.registry
    }

    pub fn executor(&self) -> &Arc<Executor> {
        &self.inner.executor
    }

    pub fn history(&self) -> Option<&History> {
        self.inner.history.as_ref()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// Count a reader of live events while the guard lives (`codebox_live_readers`).
    pub fn live_reader(&self) -> metrics::LiveReader {
        self.inner.metrics.live_reader()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is a few
        // assignments), so a poisoned lock is used as is.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start runs from the head of the queue while a slot and memory are free (asking the
    /// pool for its memory back when that is what the head waits for), then let the pool
    /// grow where the budget allows.
    fn pump(&self, st: &mut State) {
        self.admit(st);
        self.refill(st);
    }

    /// Start runs from the head of the queue while a slot and memory are free.
    fn admit(&self, st: &mut State) {
        let pool = self.inner.executor.pool();
        loop {
            match st.admission.next(pool.memory_mb()) {
                Next::Start(ticket) => self.start(st, ticket),
                // Containers still being made cannot be given back yet: when they are ready
                // (or fail), the pool tells, and admission runs again.
                Next::Shed { mb } => {
                    if self.shed(st, mb) < mb {
                        break;
                    }
                }
                Next::Wait => break,
            }
        }
    }

    /// Ask for `mb` back from what was opened ahead of time: the pool's ready containers
    /// first, then sessions opened ahead of time. Returns what was freed at once.
    fn shed(&self, st: &mut State, mb: u64) -> u64 {
        let from_pool = self.inner.executor.pool().shed(mb);
        let ahead = match self.inner.ahead.get().and_then(Weak::upgrade) {
            Some(a) => a.shed(mb.saturating_sub(from_pool)),
            None => 0,
        };
        st.admission.unhold_ahead(ahead);
        from_pool + ahead
    }

    /// Start an admitted run on its own task.
    fn start(&self, st: &mut State, ticket: Ticket) {
        let run_id = ticket.run_id;
        let Some(run) = st.live.get_mut(&run_id) else {
            return;
        };
        let now = Instant::now();
        let RunState::Queued { request } =
            std::mem::replace(&mut run.state, RunState::Running { started: now })
        else {
            return;
        };
        let queued_ms = now.duration_since(run.accepted).as_millis() as u64;
        let cancel = run.cancel.clone();
        let work = run.work.take();
        let feed = run.feed.clone();
        if run.shared {
            if let Some(q) = self.shared().cloned() {
                let manager = self.clone();
                tokio::spawn(async move {
                    manager
                        .start_claimed(q, run_id, *request, queued_ms, cancel, feed)
                        .await
                });
                return;
            }
        }
        if let Some(h) = &self.inner.history {
            h.started(&run_id);
        }
        self.spawn(run_id, *request, queued_ms, cancel, work, feed);
    }

    /// Start a run claimed from the shared queue (its slot is held): only once the database
    /// confirms that the claim is still this server's, which takes the row out of the queue
    /// and marks the run `running` ([`SharedQueue::take`]). A claim given back meanwhile
    /// (this server's lease was judged lapsed) is dropped here without starting: the run is
    /// the queue's, or another server's now, and must not run twice.
    async fn start_claimed(
        &self,
        queue: SharedQueue,
        run_id: String,
        request: ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
        feed: Arc<Feed>,
    ) {
        loop {
            match queue.take(&run_id).await {
                Ok(true) => {
                    self.spawn(run_id, request, queued_ms, cancel, None, feed);
                    return;
                }
                Ok(false) => {
                    tracing::warn!(
                        run_id,
                        "a run claimed here was given back to the shared queue before it started (this server's lease was judged lapsed): not started here; another server runs it"
                    );
                    let mut st = self.lock();
                    if let Some(run) = st.live.remove(&run_id) {
                        st.admission.release(&run.ticket);
                        self.inner.executor.pool().done(&run.shapes);
                        run.feed.abandon();
                    }
                    queue.wake();
                    self.inner.changed.notify_waiters();
                    self.pump(&mut st);
                    return;
                }
                Err(e) if cancel.is_cancelled() => {
                    tracing::warn!(run_id, error = %e, "a claimed run was stopped while the shared queue could not confirm its claim; it did not start here");
                    let mut st = self.lock();
                    let report = st.live.get(&run_id).map(|run| {
                        let mut r = run.base.clone();
                        r.status = Status::Stopped;
                        r.queued_ms = queued_ms;
                        r.message = QUEUED_STOP.to_string();
                        r
                    });
                    if let Some(r) = report {
                        self.finish(&mut st, &run_id, Ok(r));
                    }
                    return;
                }
                Err(e) => {
                    tracing::debug!(run_id, error = %e, "cannot confirm a claimed run's claim before it starts; trying again");
                    tokio::select! {
                        () = tokio::time::sleep(QUEUE_RETRY) => {}
                        () = cancel.cancelled() => {}
                    }
                }
            }
        }
    }

    /// Start filling the pool where it is short, while admission lets it grow.
    fn refill(&self, st: &State) {
        let pool = self.inner.executor.pool();
        while let Some(shape) = pool.wanted() {
            if !st
                .admission
                .pool_may_grow(pool.memory_mb(), shape.memory_mb)
            {
                break;
            }
            pool.fill(shape);
        }
    }

    /// Keep containers ready for the languages of `pool.sizes` and for what runs have asked
    /// for lately (`codebox serve`): fill the pool now and whenever it runs short, and replace
    /// containers that waited too long.
    pub fn start_pool(&self) {
        let pool = self.inner.executor.pool();
        let floors = floors_for(&self.inner.registry, &self.inner.config);
        if floors.is_empty() {
            return;
        }
        pool.set_floors(floors);
        self.refill(&self.lock());
        self.own(tokio::spawn(pool_loop(Arc::downgrade(&self.inner))));
    }

    /// Carry out an admitted run on a task of its own, watched by a second task that records
    /// its end even if the first panics.
    fn spawn(
        &self,
        run_id: String,
        request: ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
        work: Option<Box<dyn Work>>,
        feed: Arc<Feed>,
    ) {
        let executor = self.inner.executor.clone();
        let id = run_id.clone();
        // A job's work begins now, as the run starts (see [`Work::run`]).
        let run: BoxFuture<'static, RunReport> = match work {
            Some(work) => work.run(Start {
                run_id: id,
                request,
                queued_ms,
                cancel,
                feed,
            }),
            None => Box::pin(async move {
                let call = Call {
                    run_id: &id,
                    req: &request,
                    queued_ms,
                    cancel,
                    feed: Some(&feed),
                };
                executor.execute_live(call).await
            }),
        };
        let task = tokio::spawn(run);
        let manager = self.clone();
        tokio::spawn(async move {
            let outcome = task.await.map_err(|e| {
                if e.is_panic() {
                    let payload = e.into_panic();
                    let why = payload
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| payload.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    format!("codebox failed while carrying out the run (a task panicked: {why}); its containers are being removed")
                } else {
                    "codebox was shutting down and abandoned the run; its containers are being removed".to_string()
                }
            });
            let mut st = manager.lock();
            manager.finish(&mut st, &run_id, outcome);
        });
    }

    /// Record a run's end, free its slot and memory, wake waiters, start what can start.
    /// `Err` carries why the run's task failed.
    fn finish(&self, st: &mut State, run_id: &str, outcome: Result<RunReport, String>) {
        let Some(run) = st.live.remove(run_id) else {
            return;
        };
        let fenced = run.fenced.is_some();
        let report = match outcome {
            Ok(report) => report,
            Err(message) => {
                tracing::error!(run_id, %message, "a run's task failed");
                let mut r = run.base.clone();
                r.status = Status::SandboxError;
                r.message = message;
                if let RunState::Running { started } = run.state {
                    r.duration_ms = started.elapsed().as_millis() as u64;
                }
                r
            }
        };
        let report = match run.fenced.clone() {
            Some(theirs) => {
                tracing::warn!(
                    run_id,
                    here = report.status.as_str(),
                    kept = theirs.status.as_str(),
                    "a run this server held ended after the others had reported it (this server's lease was judged lapsed): their report stands"
                );
                theirs
            }
            None => report,
        };
        if matches!(run.state, RunState::Running { .. }) {
            st.admission.release(&run.ticket);
        }
        if let Some(q) = self.shared() {
            if run.shared && matches!(run.state, RunState::Queued { .. }) {
                q.settle(run_id);
            }
            // Room here grew: claim.
            q.wake();
        }
        self.inner.executor.pool().done(&run.shapes);
        let report = Arc::new(report);
        if let Some(h) = self.inner.history.as_ref().filter(|_| !fenced) {
            h.finish(report.clone());
        }
        self.inner.metrics.record(&report);
        run.done.send_replace(Some(report.clone()));
        run.feed.finish(report.clone());
        st.retention.keep(run_id, report);
        let max_bytes = self
            .inner
            .config
            .runs
            .retained_reports_mb
            .saturating_mul(1024 * 1024);
        for _ in 0..st.retention.evict_over(max_bytes) {
            self.inner.metrics.report_evicted();
        }
        self.pump(st);
    }

    /// Stop these runs (a job's holder ended): queued ones end `stopped`, naming why in
    /// `message`; running ones are stopped.
    fn stop_runs_locked(&self, st: &mut State, run_ids: &[String], message: &str) {
        let message = format!("stopped before it started: {message}");
        for run_id in run_ids {
            if self.stop_queued(st, run_id, &message).is_none() {
                if let Some(run) = st.live.get(run_id) {
                    run.cancel.cancel();
                }
            }
        }
    }

    /// End a queued run `stopped` with `message`, at once; `None` if it is not queued.
    fn stop_queued(&self, st: &mut State, run_id: &str, message: &str) -> Option<RunReport> {
        let run = st.live.get(run_id)?;
        if !st.admission.withdraw(run_id) {
            return None;
        }
        let mut r = run.base.clone();
        r.status = Status::Stopped;
        r.queued_ms = run.accepted.elapsed().as_millis() as u64;
        r.message = message.to_string();
        self.finish(st, run_id, Ok(r.clone()));
        Some(r)
    }

    /// The run's report from memory: final, or in progress (`queued`/`running`, with times
    /// so far). `None` for an unknown, expired or evicted run id ([`RunManager::wait`] also
    /// asks the history database).
    pub fn report(&self, run_id: &str) -> Option<RunReport> {
        let st = self.lock();
        if let Some(r) = st.retention.get(run_id) {
            return Some((**r).clone());
        }
        let run = st.live.get(run_id)?;
        let mut r = run.base.clone();
        match &run.state {
            RunState::Queued { .. } => {
                r.queued_ms = run.accepted.elapsed().as_millis() as u64;
                r.message = format!(
                    "waiting for a free slot: number {} of {} in the queue",
                    st.admission.position(run_id).unwrap_or(0),
                    st.admission.queued()
                );
            }
            RunState::Running { started } => {
                r.status = Status::Running;
                r.queued_ms = started.duration_since(run.accepted).as_millis() as u64;
                r.duration_ms = started.elapsed().as_millis() as u64;
                r.message = format!("running for {:.1} s", started.elapsed().as_secs_f64());
            }
        }
        Some(r)
    }

    /// The live events of an unfinished run; `None` once it has ended (its report then
    /// says everything) or when this server does not hold it.
    pub fn feed(&self, run_id: &str) -> Option<Arc<Feed>> {
        self.lock().live.get(run_id).map(|r| r.feed.clone())
    }

    /// Where an unfinished run stands; `None` when unknown or finished and forgotten.
    pub fn progress(&self, run_id: &str) -> Option<Progress> {
        let st = self.lock();
        let Some(run) = st.live.get(run_id) else {
            let report = st.retention.get(run_id)?;
            return Some(Progress {
                status: report.status,
                elapsed: Duration::from_millis(report.queued_ms + report.duration_ms),
                queue_position: None,
                budget: Duration::ZERO,
            });
        };
        let (status, queue_position) = match &run.state {
            RunState::Queued { .. } => (Status::Queued, st.admission.position(run_id)),
            RunState::Running { .. } => (Status::Running, None),
        };
        Some(Progress {
            status,
            elapsed: run.accepted.elapsed(),
            queue_position,
            budget: run.budget,
        })
    }

    /// Wait for the run's end, however long it takes (its own limits bound it).
    pub async fn wait_end(&self, run_id: &str) -> Result<RunReport, LookupError> {
        loop {
            let report = self.wait(run_id, Duration::from_secs(60)).await?;
            if report.status.is_terminal() {
                return Ok(report);
            }
        }
    }

    /// Wait up to `timeout` for the run to end, then return its report as it stands. A run
    /// not in memory is looked up in the history database (see [`LookupError`]): one another
    /// server holds is waited on there ([`Peers`]), or looked at again until it ends; one in
    /// the shared queue is waited on until a server (perhaps this one) claims it. An id the
    /// history does not know is looked for again during [`UNKNOWN_GRACE`] (within `timeout`).
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunReport, LookupError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let grace = start + timeout.min(UNKNOWN_GRACE);
        // What the server holding it said last (returned if the wait ends before the run).
        let mut elsewhere: Option<RunReport> = None;
        let mut unknown_nap = UNKNOWN_POLL;
        loop {
            let (rx, pending) = {
                let st = self.lock();
                if let Some(r) = st.retention.get(run_id) {
                    return Ok((**r).clone());
                }
                let rx = st.live.get(run_id).map(|r| r.done.subscribe());
                (rx, st.pending.contains_key(run_id))
            };
            if let Some(mut rx) = rx {
                let left = deadline.saturating_duration_since(Instant::now());
                if !left.is_zero() {
                    let gone = matches!(
                        tokio::time::timeout(left, rx.wait_for(|r| r.is_some())).await,
                        Ok(Err(_))
                    );
                    if gone && rx.borrow().is_none() {
                        // It left without a report: given back to the shared queue.
                        continue;
                    }
                }
                // The final report, even if it has just been evicted from memory.
                let finished = rx.borrow().clone();
                if let Some(report) = finished {
                    return Ok((*report).clone());
                }
                return match self.report(run_id) {
                    Some(r) => Ok(r),
                    None => self.stored_report(run_id).await,
                };
            }
            let pause = if pending {
                UNKNOWN_POLL
            } else {
                let outcome = self.stored_report(run_id).await;
                let now = Instant::now();
                match &outcome {
                    // In the shared queue, claimed by nobody yet.
                    Ok(r) if !r.status.is_terminal() && now < deadline => ELSEWHERE_POLL,
                    Err(LookupError::Elsewhere { .. }) if now < deadline => {
                        if let Some(peers) = self.inner.peers.get() {
                            if let Some(r) = peers.wait(self, run_id, deadline - now).await {
                                if r.status.is_terminal() || Instant::now() >= deadline {
                                    return Ok(r);
                                }
                                elsewhere = Some(r);
                                continue;
                            }
                        }
                        ELSEWHERE_POLL
                    }
                    Err(LookupError::Elsewhere { .. }) if elsewhere.is_some() => {
                        return Ok(elsewhere.take().expect("checked"));
                    }
                    // In a cluster, a run another server holds is answered as it stands when
                    // the wait ends (the caller asks again), as for one held here.
                    Err(LookupError::Elsewhere { status, owner, .. })
                        if self.inner.peers.get().is_some() =>
                    {
                        let row = match &self.inner.history {
                            Some(h) => h.get(run_id).await.ok().flatten(),
                            None => None,
                        };
                        return Ok(RunReport::new(
                            run_id,
                            row.as_ref().map(|r| r.language.clone()).unwrap_or_default(),
                            *status,
                            row.map(|r| r.limits).unwrap_or(NO_LIMITS),
                            format!("{} on another codebox server ({owner})", status.as_str()),
                        ));
                    }
                    Err(LookupError::Unknown { .. })
                        if now < grace && self.inner.history.is_some() =>
                    {
                        // Back off (doubling): an unknown id costs a handful of lookups.
                        unknown_nap = (unknown_nap * 2).min(UNKNOWN_GRACE);
                        unknown_nap / 2
                    }
                    _ => return outcome,
                }
            };
            // An insert pending here answers soon (and wakes `changed`): never a zero nap
            // past the deadline, which would spin.
            let nap = if pending {
                pause
            } else {
                pause.min(deadline.saturating_duration_since(Instant::now()))
            };
            let moved = self.shared().map(|q| q.moved().notified());
            tokio::select! {
                () = tokio::time::sleep(nap) => {}
                () = self.inner.changed.notified() => {}
                () = async {
                    match moved {
                        Some(m) => m.await,
                        None => std::future::pending().await,
                    }
                } => {}
            }
        }
    }

    /// Stop a run: a queued one ends `stopped` at once; a running one is killed and its
    /// containers removed before this returns. A finished run keeps its final report.
    pub async fn stop(&self, run_id: &str) -> Result<RunReport, LookupError> {
        // A run submitted here to the shared queue a moment ago: its insert answers first.
        for _ in 0..100 {
            if !self.lock().pending.contains_key(run_id) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..2 {
            if let Some(r) = self.stop_once(run_id).await {
                return r;
            }
        }
        self.stored_report(run_id).await
    }

    /// [`RunManager::stop`]: `None` when the run came here while it looked (claimed from the
    /// shared queue), so that it looks again.
    async fn stop_once(&self, run_id: &str) -> Option<Result<RunReport, LookupError>> {
        let running = {
            let mut st = self.lock();
            if let Some(r) = st.retention.get(run_id) {
                return Some(Ok((**r).clone()));
            }
            match st.live.get(run_id).map(|r| &r.state) {
                None => false,
                Some(RunState::Running { .. }) => {
                    st.live[run_id].cancel.cancel();
                    true
                }
                Some(RunState::Queued { .. }) => {
                    if let Some(r) = self.stop_queued(&mut st, run_id, QUEUED_STOP) {
                        return Some(Ok(r));
                    }
                    false
                }
            }
        };
        if running {
            return Some(self.wait(run_id, STOP_WAIT).await);
        }
        // Not this server's: in the shared queue, held by another, evicted, or finished.
        if let Some(q) = self.shared() {
            match q.withdraw(run_id, QUEUED_STOP).await {
                Ok(Some(r)) => {
                    self.inner.metrics.record(&r);
                    return Some(Ok(r));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "cannot take a run out of the shared queue")
                }
            }
            if self.holds_run(run_id) {
                // This server claimed it meanwhile.
                return None;
            }
            if let Some(peers) = self.inner.peers.get() {
                if let Some(r) = peers.stop(self, run_id).await {
                    return Some(Ok(r));
                }
            }
        }
        Some(self.stored_report(run_id).await)
    }

    /// Forget finished runs whose retention passed, in memory and (their full reports; the
    /// metadata stays) in the history database.
    pub fn purge_expired(&self) {
        let forgotten = self.lock().retention.purge(self.retention());
        if let Some(h) = &self.inner.history {
            h.forget_reports(forgotten);
        }
    }

    /// Clear the full reports of every history row that ended more than the retention (and
    /// one purge interval) ago: rows this manager does not track (an earlier server's).
    fn sweep_history(&self) {
        if let Some(h) = &self.inner.history {
            let keep = self.retention() + PURGE_INTERVAL;
            h.forget_reports_ended_before(now_ms().saturating_sub(keep.as_millis() as i64));
        }
    }

    /// Refuse new runs and start no queued one; the pool fills no more. What holds memory
    /// beside runs (sessions) is closed before [`RunManager::shutdown`] with this.
    pub fn close(&self) {
        self.inner.executor.pool().close();
        self.lock().admission.close();
    }

    /// Give the unstarted claims back, [`RunManager::close`], stop every queued and running
    /// run, and wait (up to `grace` for the stops, and as long again for the removals) until
    /// their containers are gone.
    pub async fn shutdown(&self, grace: Duration) {
        if tokio::time::timeout(grace, self.hand_back_unstarted())
            .await
            .is_err()
        {
            tracing::warn!("the shared queue did not take the unstarted claims back in time; they go back once this server's lease lapses");
        }
        self.close();
        let ids: Vec<String> = self.lock().live.keys().cloned().collect();
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        if !ids.is_empty() {
            tracing::info!(runs = ids.len(), "stopping unfinished runs");
            let stops = ids.iter().map(|id| self.stop(id));
            let _ = tokio::time::timeout(grace, futures_util::future::join_all(stops)).await;
        }
        // Sessions' containers (and those of the stopped runs) are removed in the background.
        self.inner.executor.cleanup().drain(grace).await;
        // Then the installed prefixes they mounted.
        if tokio::time::timeout(grace, self.inner.executor.packages().close())
            .await
            .is_err()
        {
            tracing::warn!("some installed package prefixes could not be removed in time; the next start reaps them");
        }
    }

    /// Drain (SIGTERM in a cluster): refuse new runs and sessions, let every queued and
    /// running run finish, and return once none is left (`true`) or `limit` has passed.
    /// [`RunManager::shutdown`] then stops what is left.
    pub async fn drain(&self, limit: Duration) -> bool {
        /// How often a drain looks whether the last run has ended.
        const DRAIN_POLL: Duration = Duration::from_millis(100);
        let left = {
            let mut st = self.lock();
            st.admission.drain();
            st.live.len()
        };
        tracing::info!(
            runs = left,
            "draining: no new runs; waiting for the queued and running ones to finish"
        );
        self.hand_back_unstarted().await;
        let deadline = Instant::now() + limit;
        loop {
            let idle = {
                let st = self.lock();
                st.live.is_empty() && st.pending.is_empty()
            };
            if idle {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }

    /// Give the runs claimed from the shared queue that have not started back to it (a drain
    /// or a shutdown): another server runs them. If the database cannot be told, they go back
    /// once this server's lease lapses.
    async fn hand_back_unstarted(&self) {
        let Some(queue) = self.shared().cloned() else {
            return;
        };
        let ids: Vec<String> = {
            let mut st = self.lock();
            let ids: Vec<String> = st
                .live
                .iter()
                .filter(|(_, r)| r.shared && matches!(r.state, RunState::Queued { .. }))
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                st.admission.withdraw(id);
                if let Some(run) = st.live.remove(id) {
                    self.inner.executor.pool().done(&run.shapes);
                    run.feed.abandon();
                }
            }
            ids
        };
        if ids.is_empty() {
            return;
        }
        match queue.hand_back(ids).await {
            Ok(n) => tracing::info!(
                runs = n,
                "gave the claimed runs that had not started back to the shared queue"
            ),
            Err(e) => {
                tracing::warn!(error = %e, "cannot give claimed runs back to the shared queue; they go back once this server's lease lapses")
            }
        }
    }

    /// This server's lease was judged lapsed (it was paused or cut off for longer than the
    /// lease) and it re-joined: the others marked its runs `sandbox_error` ("its server
    /// stopped answering"), ended its sessions and gave its unstarted claims back. Here the
    /// same then holds: every run the history has a final report for is stopped (its
    /// containers removed) and answers with that report, every session the history ended
    /// ends. What the history does not say ended stays: claims are fenced when they start
    /// ([`RunManager::start_claimed`]), and runs accepted since are this server's.
    async fn fence(&self, lapse: crate::history::Lapse) {
        let Some(history) = self.inner.history.clone() else {
            return;
        };
        let (ids, recent) = {
            let st = self.lock();
            let within = lapse.unrenewed + Duration::from_secs(1);
            let ids: Vec<String> = st.live.keys().cloned().collect();
            (ids, st.retention.ended_within(within))
        };
        // Runs that ended here while the lease was not renewed: the report the others wrote
        // first is the run's (the one here was dropped by the history), here too.
        let mut replaced = 0;
        for id in recent {
            if let Ok(Some(theirs)) = history.report(&id, None).await {
                let mut st = self.lock();
                let differs = st.retention.get(&id).is_some_and(|mine| {
                    mine.status != theirs.status || mine.message != theirs.message
                });
                if differs {
                    tracing::warn!(run_id = id, kept = theirs.status.as_str(), "a run that ended here while this server's lease was judged lapsed was reported by the others first: their report stands here too");
                    st.retention.replace(&id, Arc::new(theirs));
                    replaced += 1;
                }
            }
        }
        let mut ended = Vec::new();
        for id in ids {
            match history.report(&id, None).await {
                Ok(Some(r)) => ended.push(r),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(run_id = id, error = %e, "cannot tell whether the others ended a run this server holds")
                }
            }
        }
        let runs = ended.len();
        {
            let mut st = self.lock();
            for report in ended {
                let id = report.run_id.clone();
                let Some(run) = st.live.get_mut(&id) else {
                    continue;
                };
                run.fenced = Some(report);
                match run.state {
                    RunState::Running { .. } => run.cancel.cancel(),
                    RunState::Queued { .. } => {
                        self.stop_queued(&mut st, &id, QUEUED_STOP);
                    }
                }
            }
            self.pump(&mut st);
        }
        tracing::warn!(
            runs,
            replaced,
            "stopping the runs the other servers ended while this server's lease was judged lapsed"
        );
    }

    /// Whether the server is draining (its `/healthz` says so, for a balancer).
    pub fn is_draining(&self) -> bool {
        self.lock().admission.is_draining()
    }

    // ---- taking requests: validated, charged, given an id, recorded, queued

    /// Validate a request and queue it. Returns at once; the run starts when admitted.
    pub fn submit(&self, req: RunRequest) -> Result<Accepted, SubmitError> {
        let feed = Feed::new(self.feed_bytes());
        self.submit_with(req, feed, false)
    }

    /// [`RunManager::submit`], with the program's stdin given while it runs: what `stdin`
    /// brings is passed on until it closes (the request's own `stdin` comes first). Returns
    /// the run's live events too.
    pub fn submit_interactive(
        &self,
        req: RunRequest,
        stdin: tokio::sync::mpsc::Receiver<bytes::Bytes>,
    ) -> Result<(Accepted, Arc<Feed>), SubmitError> {
        let feed = Feed::with_stdin(self.feed_bytes(), stdin);
        self.submit_with(req, feed.clone(), true).map(|a| (a, feed))
    }

    /// The output a run's live events keep in all: four times the cap of one stream.
    fn feed_bytes(&self) -> u64 {
        let cap = self.inner.config.sandbox.output_limit_bytes;
        cap.saturating_mul(4)
    }

    fn submit_with(
        &self,
        req: RunRequest,
        feed: Arc<Feed>,
        interactive: bool,
    ) -> Result<Accepted, SubmitError> {
        if req.session_id.is_some() {
            // The doors hand these to the sessions, which submit them as jobs.
            return Err(SubmitError::Invalid(RequestError {
                field: "session_id".into(),
                message: "this door runs no session executions; leave session_id out".into(),
            }));
        }
        // A run whose stdin comes while it runs stays here, where its client is.
        let shared = self.shared().filter(|_| !interactive).cloned();
        let original = shared.as_ref().map(|_| req.clone());
        let valid = ValidRequest::new(req, &self.inner.registry, &self.inner.config)?;
        let budget_mb = self.inner.config.runs.memory_budget_mb;
        let slots = parallelism(&valid, &self.inner.config);
        let charge_mb = run_charge(&valid, &self.inner.config, slots);
        let install_mb = self.inner.config.packages.install_memory_mb;
        if !valid.packages.is_empty() && install_mb > budget_mb {
            return Err(SubmitError::Invalid(RequestError {
                field: "packages".into(),
                message: format!(
                    "installing packages takes {install_mb} MB (packages.install_memory_mb), more than the {budget_mb} MB this server runs at once (runs.memory_budget_mb)"
                ),
            }));
        }
        if charge_mb > budget_mb {
            return Err(SubmitError::Invalid(RequestError {
                field: "limits.memory_mb".into(),
                message: format!(
                    "requested {} MB of memory; this server runs at most {budget_mb} MB of runs at once, so the maximum here is {budget_mb} MB",
                    valid.limits.memory_mb
                ),
            }));
        }
        if let (Some(queue), Some(request)) = (shared, original) {
            return self.submit_shared(queue, request, valid, slots, charge_mb, feed);
        }
        self.enqueue(valid, slots, charge_mb, feed)
    }

    /// A run's history row, as this server records it.
    fn history_row(&self, run_id: &str, valid: &ValidRequest) -> NewRun {
        NewRun::new(
            run_id,
            &valid.language.id,
            valid.limits,
            &valid.code,
            self.inner.config.history.code,
            self.inner.executor.instance(),
        )
    }

    /// Put a run in the shared queue (its insert answers on a task): whichever server has room
    /// claims it, this one included. If the queue cannot take it (the database is down), it
    /// runs here, as without a cluster: an accepted run is never lost.
    fn submit_shared(
        &self,
        queue: SharedQueue,
        request: RunRequest,
        valid: ValidRequest,
        slots: usize,
        charge_mb: u64,
        feed: Arc<Feed>,
    ) -> Result<Accepted, SubmitError> {
        let run_id = new_run_id();
        let claim_here = {
            let mut st = self.lock();
            if st.admission.refuses_new() {
                return Err(SubmitError::ShuttingDown);
            }
            let (free_slots, free_mb) = st.room();
            let here = slots <= free_slots && charge_mb <= free_mb;
            let reserved = if here { (slots, charge_mb) } else { (0, 0) };
            st.pending.insert(run_id.clone(), reserved);
            here
        };
        let limits = valid.limits;
        let base = Executor::blank_report(&run_id, &valid);
        let submitted = Submitted {
            row: self.history_row(&run_id, &valid),
            request: serde_json::to_string(&request).unwrap_or_default(),
            base: serde_json::to_string(&base).unwrap_or_default(),
            slots,
            charge_mb,
            claim_here,
        };
        let manager = self.clone();
        let id = run_id.clone();
        tokio::spawn(async move {
            let origin = match queue.submit(submitted).await {
                Ok(true) => Some(Origin::Claimed { waited_ms: 0 }),
                Ok(false) => None,
                Err(e) => {
                    tracing::warn!(run_id = id, error = %e, "the shared queue cannot take a run; it runs on this server");
                    Some(Origin::Taken)
                }
            };
            if let Some(origin) = origin {
                let taken =
                    manager.enqueue_as(id.clone(), origin, valid, slots, charge_mb, None, feed);
                if let Err(e) = taken {
                    tracing::error!(run_id = id, error = %e, "a run accepted for the shared queue could not be queued here");
                    if origin != Origin::Taken {
                        let _ = queue.hand_back(vec![id.clone()]).await;
                    }
                }
            }
            manager.lock().pending.remove(&id);
            manager.inner.changed.notify_waiters();
            queue.wake();
        });
        Ok(Accepted {
            run_id,
            status: Status::Queued,
            limits,
        })
    }

    /// Queue a run claimed from the shared queue; one that cannot run here ends
    /// `sandbox_error` saying why, one refused (shutting down) goes back.
    fn take_claimed(&self, c: Claimed) {
        if self.lock().live.contains_key(&c.run_id) {
            // Claimed again after its claim was given back: the entry here starts it.
            return;
        }
        let queue = self.shared().cloned();
        let checked = serde_json::from_str::<RunRequest>(&c.request)
            .map_err(|e| format!("its request is unreadable: {e}"))
            .and_then(|req| {
                ValidRequest::new(req, &self.inner.registry, &self.inner.config)
                    .map_err(|e| e.to_string())
            });
        let valid = match checked {
            Ok(v) => v,
            Err(why) => {
                let mut r = RunReport::new(
                    &c.run_id,
                    "",
                    Status::SandboxError,
                    NO_LIMITS,
                    format!(
                        "codebox server {} claimed this run from the shared queue and cannot run it: {why}; check that every server has the same languages.toml and limits",
                        self.inner.executor.instance()
                    ),
                );
                r.queued_ms = c.waited_ms;
                if let Some(h) = &self.inner.history {
                    h.finish(Arc::new(r));
                }
                if let Some(q) = &queue {
                    q.settle(&c.run_id);
                }
                return;
            }
        };
        let slots = parallelism(&valid, &self.inner.config);
        let charge_mb = run_charge(&valid, &self.inner.config, slots);
        let feed = Feed::new(self.feed_bytes());
        let origin = Origin::Claimed {
            waited_ms: c.waited_ms,
        };
        let queued = self.enqueue_as(
            c.run_id.clone(),
            origin,
            valid,
            slots,
            charge_mb,
            None,
            feed,
        );
        self.inner.changed.notify_waiters();
        if queued.is_err() {
            if let Some(q) = queue {
                tokio::spawn(async move { q.hand_back(vec![c.run_id]).await });
            }
        }
    }

    /// Queue a job: a run its submitter carries out (one slot, `job.charge_mb`, one at a
    /// time per `job.serial`). Refused as a run is; its work is then dropped unrun.
    pub fn submit_job(&self, job: Job) -> Result<Accepted, SubmitError> {
        let feed = Feed::new(self.feed_bytes());
        let (charge_mb, request) = (job.charge_mb, job.request);
        let held = Held {
            serial: job.serial,
            at: job.at,
            work: job.work,
        };
        self.enqueue_as(
            job.run_id,
            Origin::New,
            request,
            1,
            charge_mb,
            Some(held),
            feed,
        )
    }

    fn enqueue(
        &self,
        valid: ValidRequest,
        slots: usize,
        charge_mb: u64,
        feed: Arc<Feed>,
    ) -> Result<Accepted, SubmitError> {
        self.enqueue_as(
            new_run_id(),
            Origin::New,
            valid,
            slots,
            charge_mb,
            None,
            feed,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn enqueue_as(
        &self,
        run_id: String,
        origin: Origin,
        valid: ValidRequest,
        slots: usize,
        charge_mb: u64,
        job: Option<Held>,
        feed: Arc<Feed>,
    ) -> Result<Accepted, SubmitError> {
        self.purge_expired();
        let limits = valid.limits;
        let claimed = matches!(origin, Origin::Claimed { .. });
        // The history row (its code hash) is made before the lock is taken; a claimed run's
        // was made by the server that took it.
        let history = self.inner.history.as_ref().filter(|_| !claimed);
        let row = history.map(|_| self.history_row(&run_id, &valid));
        let mut base = Executor::blank_report(&run_id, &valid);
        let budget = Executor::budget(&valid);
        // The pool follows what runs ask for (a job runs where its submitter says).
        let shapes = if job.is_none() {
            shapes_of(&valid, &self.inner.config, slots)
        } else {
            Vec::new()
        };
        let mut row = row;
        let (serial, work) = match job {
            Some(h) => {
                row = row.map(|r| r.in_session(&h.at.session_id, h.at.execution_count));
                base.session = Some(h.at);
                (Some(h.serial), Some(h.work))
            }
            None => (None, None),
        };
        let mut st = self.lock();
        let ticket = Ticket {
            run_id: run_id.clone(),
            slots,
            charge_mb,
            session: serial,
        };
        let queued = match origin {
            Origin::New => st.admission.enqueue(ticket.clone()),
            Origin::Taken | Origin::Claimed { .. } => st.admission.enqueue_taken(ticket.clone()),
        };
        if let Err(refusal) = queued {
            drop(st);
            drop(work);
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
        let now = Instant::now();
        let accepted = match origin {
            Origin::Claimed { waited_ms } => now
                .checked_sub(Duration::from_millis(waited_ms))
                .unwrap_or(now),
            _ => now,
        };
        st.live.insert(
            run_id.clone(),
            Live {
                base,
                ticket,
                shapes,
                work,
                budget,
                accepted,
                state: RunState::Queued {
                    request: Box::new(valid),
                },
                cancel: CancellationToken::new(),
                done,
                feed,
                shared: claimed,
                fenced: None,
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

    // ---- reports not in memory

    /// The final report of a run that is not in memory ([`lookup::stored`]).
    async fn stored_report(&self, run_id: &str) -> Result<RunReport, LookupError> {
        let retention = self.retention();
        let evicted_live = self.lock().retention.evicted_within(run_id, retention);
        let at = lookup::Where {
            history: self.inner.history.as_ref(),
            instance: self.inner.executor.instance(),
            retention,
            retained_reports_mb: self.inner.config.runs.retained_reports_mb,
        };
        lookup::stored(at, run_id, evicted_live).await
    }

    // ---- whose is it (several servers as one: the cluster module asks)

    /// Whether this server holds run `run_id` (queued, running, or its report kept here).
    pub fn holds_run(&self, run_id: &str) -> bool {
        let st = self.lock();
        st.live.contains_key(run_id)
            || st.retention.get(run_id).is_some()
            || st.pending.contains_key(run_id)
    }

    // ---- counts

    pub fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            queued: st.admission.queued(),
            active: st.admission.active(),
            active_memory_mb: st.admission.active_memory_mb(),
            peak_active: st.admission.peak_active(),
            retained: st.retention.len(),
            retained_report_bytes: st.retention.bytes(),
            evicted: st.retention.evicted(),
            ..stats::of_executor(&self.inner.executor)
        }
    }
}

// ---- memory held beside runs (sessions): one ledger, admission's

impl RunManager {
    /// Hold `mb` of the budget beside runs, now or never: the pool's containers and what
    /// was opened ahead of time give theirs back when that makes room. `ahead`: for
    /// something opened ahead of time, only while nobody waits and the budget has room.
    /// Locks the manager: never call it holding a lock [`Ahead::shed`] takes.
    pub fn hold(&self, mb: u64, ahead: bool) -> Result<(), String> {
        let mut st = self.lock();
        if st.admission.refuses_new() {
            return Err("the server is shutting down".into());
        }
        let pool = self.inner.executor.pool();
        if ahead {
            // Only into room nobody waits for.
            if st.admission.queued() > 0 || !st.admission.may_hold(mb, pool.memory_mb()) {
                return Err("no room".into());
            }
            st.admission.hold_ahead(mb);
            return Ok(());
        }
        let short = st.admission.shortfall(mb, pool.memory_mb());
        if short > 0 {
            self.shed(&mut st, short);
        }
        if !st.admission.may_hold(mb, pool.memory_mb()) {
            return Err(format!(
                "runs are using the memory budget (runs.memory_budget_mb) now; {mb} MB are not free"
            ));
        }
        st.admission.hold(mb);
        Ok(())
    }

    /// Give back what [`RunManager::hold`] held, and start what can start.
    pub fn unhold(&self, mb: u64, ahead: bool) {
        let mut st = self.lock();
        if ahead {
            st.admission.unhold_ahead(mb);
        } else {
            st.admission.unhold(mb);
        }
        self.pump(&mut st);
    }

    /// What was held ahead of time is now held for good: no longer given back on demand.
    pub fn claim(&self, mb: u64) {
        self.lock().admission.claim(mb);
    }

    /// Something opened ahead of time is ready: a queued run that asked for its memory
    /// while it was being opened may take it back now.
    pub fn opened_ahead(&self) {
        let mut st = self.lock();
        self.admit(&mut st);
    }

    /// Stop these runs (their holder ended): queued ones end `stopped`, naming why in
    /// `message`; running ones are stopped.
    pub fn stop_runs(&self, run_ids: &[String], message: &str) {
        let mut st = self.lock();
        self.stop_runs_locked(&mut st, run_ids, message);
        self.pump(&mut st);
    }

    /// Whether the manager was closed ([`RunManager::close`]).
    pub fn is_closed(&self) -> bool {
        self.lock().admission.is_closed()
    }
}

async fn pool_loop(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(POOL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let manager = RunManager { inner };
        manager.inner.executor.pool().expire();
        let st = manager.lock();
        if st.admission.is_closed() {
            return;
        }
        manager.refill(&st);
    }
}

/// Stop what the others ended each time this server finds its lease was judged lapsed.
async fn fence_loop(inner: Weak<Inner>, mut lapses: watch::Receiver<crate::history::Lapse>) {
    while lapses.changed().await.is_ok() {
        let lapse = *lapses.borrow_and_update();
        let Some(inner) = inner.upgrade() else { return };
        RunManager { inner }.fence(lapse).await;
    }
}

async fn purge_loop(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(PURGE_INTERVAL);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let manager = RunManager { inner };
        manager.purge_expired();
        manager.sweep_history();
    }
}

/// Claim from the shared queue what fits this server, whenever work arrives, room here grows,
/// or [`QUEUE_POLL`] has passed; nothing while draining.
async fn claim_loop(inner: Weak<Inner>, queue: SharedQueue) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let manager = RunManager { inner: strong };
        let room = {
            let mut st = manager.lock();
            if st.admission.is_closed() {
                return;
            }
            let (slots, memory_mb) = st.room();
            let policy = st.admission.policy();
            if slots > 0 && memory_mb > 0 {
                // Reserved until what it claims is queued here: a run submitted here while
                // the claim is on its way to the database would count on the same room, and
                // the two together overfill this server (seen as a run claimed by a server
                // whose slots were all taken, while another server had room).
                st.claiming = (slots, memory_mb);
            }
            Room {
                slots,
                memory_mb,
                max_slots: policy.max_concurrent_runs,
                budget_mb: policy.memory_budget_mb,
            }
        };
        let mut pause = QUEUE_POLL;
        if room.slots > 0 && room.memory_mb > 0 {
            let claimed = queue.claim(room).await.map(|claimed| {
                let n = claimed.len();
                for c in claimed {
                    manager.take_claimed(c);
                }
                n
            });
            manager.lock().claiming = (0, 0);
            match claimed {
                Ok(n) if n > 0 => {
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot claim from the shared queue; trying again");
                    pause = QUEUE_RETRY;
                }
            }
        }
        drop(manager);
        tokio::select! {
            () = queue.work().notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The other servers of a cluster, as the run manager sees them: a run submitted here that
/// another server claimed from the shared queue is waited on and stopped there. The cluster
/// module implements it (it knows who holds what and how to reach them); the manager only
/// asks.
pub trait Peers: Send + Sync {
    /// Wait at most `timeout` at the server that holds `run_id` for its report (as it then
    /// stands); `None` when no other living server holds it or it does not answer.
    fn wait<'a>(
        &'a self,
        manager: &'a RunManager,
        run_id: &'a str,
        timeout: Duration,
    ) -> futures_util::future::BoxFuture<'a, Option<RunReport>>;

    /// Stop `run_id` at the server that holds it; `None` as for [`Peers::wait`].
    fn stop<'a>(
        &'a self,
        manager: &'a RunManager,
        run_id: &'a str,
    ) -> futures_util::future::BoxFuture<'a, Option<RunReport>>;
}
