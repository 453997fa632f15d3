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
//! Where a new run is queued and who answers for a run not held here is the [`Dispatch`]'s
//! to say: by default this server's queue, and the history database (several servers may
//! share one: [`lookup`]); another part may plug in its own.
//!
//! Admission alone owns the budget: runs, the pool's ready containers, and what others hold
//! through [`RunManager::hold`] (sessions, and what is opened ahead of time, which gives way
//! through [`Ahead`]). A run carried out by whoever submits it (an execution in a session's
//! container) is a [`Job`]: queued, charged and reported like any run. Here: [`RunManager`]
//! whole; beside it its vocabulary ([`submit`], [`dispatch`], [`lookup`], [`stats`],
//! [`budget`]), its run table ([`table`]), and its parts with state of
//! their own ([`admission`], [`retention`], [`metrics`]).

pub mod admission;
mod budget;
mod dispatch;
mod lookup;
pub mod metrics;
pub mod retention;
mod stats;
mod submit;
mod table;

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::config::Config;
use crate::contract::{RequestError, RunRequest, ValidRequest};
use crate::executor::pool::{floors_for, Change};
use crate::executor::{new_run_id, parallelism, Executor};
use crate::history::{now_ms, History, NewRun};
use crate::live::Feed;
use crate::registry::Registry;
use crate::report::{RunReport, Status};
use admission::{Next, Policy, Refusal, Ticket};
pub use budget::{check_budget, execution_charge, memory_charge, run_charge, Ahead, BudgetError};
pub use dispatch::{Confirmed, Dispatch, Local, Submission, Taken};
pub use lookup::{LookupError, ELSEWHERE_POLL, NO_LIMITS, UNKNOWN_GRACE, UNKNOWN_POLL};
pub use metrics::Metrics;
pub use retention::{report_bytes, REPORT_OVERHEAD_BYTES};
pub use stats::{PoolSnapshot, SessionCounts, Stats};
pub use submit::{Accepted, Job, Start, SubmitError, Work};
use table::{Live, Origin, Queued, RunState, State};
pub use table::{Progress, Room};

/// How long `stop` waits for a running run's containers to be killed and removed.
const STOP_WAIT: Duration = Duration::from_secs(120);
/// How often finished reports past their retention are dropped.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// How often the pool is checked for containers to replace or add.
const POOL_INTERVAL: Duration = Duration::from_millis(500);
/// The message of a run stopped before it left the queue.
pub const QUEUED_STOP: &str = "stopped while waiting in the queue; it never started";

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
    /// Where new runs go and who answers for runs not held here, when not [`Local`].
    dispatch: OnceLock<Arc<dyn Dispatch>>,
    /// Room grew (a run ended or left): whoever places runs here may look.
    freed: Notify,
    /// A run left the table (it ended, or went back): a drain looks.
    left: Notify,
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
            state: Mutex::new(State::new(policy)),
            tasks: Mutex::new(Vec::new()),
            dispatch: OnceLock::new(),
            freed: Notify::new(),
            left: Notify::new(),
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
        manager.own(tokio::spawn(purge_loop(Arc::downgrade(&manager.inner))));
        manager
    }

    /// A background loop of this manager or of a part beside it: it ends when the manager
    /// is dropped or shut down (it holds the manager only weakly, [`RunManager::downgrade`],
    /// so that it does not keep it alive).
    pub fn own(&self, task: tokio::task::JoinHandle<()>) {
        let mut tasks = self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.push(AbortOnDropHandle::new(task));
    }

    /// This manager, held weakly.
    pub fn downgrade(&self) -> WeakRunManager {
        WeakRunManager(Arc::downgrade(&self.inner))
    }

    /// Place new runs through `dispatch` from now on, and ask it about runs not held here
    /// (sessions' executions stay here). Called once, before runs are submitted.
    pub fn dispatch_through(&self, dispatch: Arc<dyn Dispatch>) {
        let _ = self.inner.dispatch.set(dispatch);
    }

    fn dispatch(&self) -> &dyn Dispatch {
        match self.inner.dispatch.get() {
            Some(d) => d.as_ref(),
            None => &Local,
        }
    }

    /// Notified when room grew here (a run ended or left): whoever places runs here looks.
    /// One waiter; a notification none waited for is kept for the next.
    pub fn freed(&self) -> &Notify {
        &self.inner.freed
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
        if run.elsewhere {
            let manager = self.clone();
            tokio::spawn(async move {
                manager
                    .start_confirmed(run_id, *request, queued_ms, cancel, feed)
                    .await
            });
            return;
        }
        if let Some(h) = &self.inner.history {
            h.started(&run_id);
        }
        self.spawn(run_id, *request, queued_ms, cancel, work, feed);
    }

    /// Start a run placed elsewhere (its slot is held) once the dispatch confirms it is this
    /// server's ([`Dispatch::confirm`], which records it started). One given back meanwhile
    /// leaves without a report: it runs elsewhere, and must not run twice.
    async fn start_confirmed(
        &self,
        run_id: String,
        request: ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
        feed: Arc<Feed>,
    ) {
        match self.dispatch().confirm(&run_id, cancel.clone()).await {
            Confirmed::Start => self.spawn(run_id, request, queued_ms, cancel, None, feed),
            Confirmed::GivenBack => {
                let mut st = self.lock();
                if let Some(run) = st.live.remove(&run_id) {
                    st.admission.release(&run.ticket);
                    self.inner.executor.pool().done(&run.shapes);
                    run.feed.abandon();
                }
                self.inner.freed.notify_one();
                self.inner.left.notify_waiters();
                self.pump(&mut st);
            }
            Confirmed::Stopped => {
                let mut st = self.lock();
                let report = st
                    .live
                    .get(&run_id)
                    .map(|run| run.stopped(queued_ms, QUEUED_STOP));
                if let Some(r) = report {
                    self.finish(&mut st, &run_id, Ok(r));
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
        let start = Start {
            run_id: run_id.clone(),
            request,
            queued_ms,
            cancel,
            feed,
        };
        let task = tokio::spawn(submit::carry_out(self.inner.executor.clone(), work, start));
        let manager = self.clone();
        tokio::spawn(async move {
            let outcome = task.await.map_err(submit::why_it_failed);
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
        let overruled = run.overruled.is_some();
        let report = run.final_report(outcome);
        if matches!(run.state, RunState::Running { .. }) {
            st.admission.release(&run.ticket);
        }
        if run.elsewhere && matches!(run.state, RunState::Queued { .. }) {
            self.dispatch().unstarted(run_id);
        }
        self.inner.freed.notify_one();
        self.inner.left.notify_waiters();
        self.inner.executor.pool().done(&run.shapes);
        let report = Arc::new(report);
        if let Some(h) = self.inner.history.as_ref().filter(|_| !overruled) {
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

    /// End a queued run `stopped` with `message`, at once; `None` if it is not queued.
    fn stop_queued(&self, st: &mut State, run_id: &str, message: &str) -> Option<RunReport> {
        let run = st.live.get(run_id)?;
        if !st.admission.withdraw(run_id) {
            return None;
        }
        let r = run.stopped(run.accepted.elapsed().as_millis() as u64, message);
        self.finish(st, run_id, Ok(r.clone()));
        Some(r)
    }

    /// The run's report from memory: final, or in progress (`queued`/`running`, with times
    /// so far). `None` for an unknown, expired or evicted run id ([`RunManager::wait`] also
    /// asks the history database).
    pub fn report(&self, run_id: &str) -> Option<RunReport> {
        self.lock().report(run_id)
    }

    /// The live events of an unfinished run; `None` once it has ended (its report then
    /// says everything) or when this server does not hold it.
    pub fn feed(&self, run_id: &str) -> Option<Arc<Feed>> {
        self.lock().live.get(run_id).map(|r| r.feed.clone())
    }

    /// Where an unfinished run stands; `None` when unknown or finished and forgotten.
    pub fn progress(&self, run_id: &str) -> Option<Progress> {
        self.lock().progress(run_id)
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
    /// this server does not hold is the dispatch's to answer for ([`Dispatch::wait`]: by
    /// default, the history database's, see [`LookupError`]).
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunReport, LookupError> {
        let deadline = Instant::now() + timeout;
        loop {
            let rx = {
                let st = self.lock();
                if let Some(r) = st.retention.get(run_id) {
                    return Ok((**r).clone());
                }
                st.live.get(run_id).map(|r| r.done.subscribe())
            };
            let Some(mut rx) = rx else {
                match self.dispatch().wait(self, run_id, deadline).await? {
                    Some(report) => return Ok(report),
                    // It came here meanwhile.
                    None => continue,
                }
            };
            let left = deadline.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                let gone = matches!(
                    tokio::time::timeout(left, rx.wait_for(|r| r.is_some())).await,
                    Ok(Err(_))
                );
                if gone && rx.borrow().is_none() {
                    // It left without a report: given back to where it was placed.
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
    }

    /// Stop a run: a queued one ends `stopped` at once; a running one is killed and its
    /// containers removed before this returns. A finished run keeps its final report. A run
    /// this server does not hold is the dispatch's to stop ([`Dispatch::stop`]).
    pub async fn stop(&self, run_id: &str) -> Result<RunReport, LookupError> {
        for _ in 0..2 {
            let running = {
                let mut st = self.lock();
                if let Some(r) = st.retention.get(run_id) {
                    return Ok((**r).clone());
                }
                match st.live.get(run_id).map(|r| &r.state) {
                    None => false,
                    Some(RunState::Running { .. }) => {
                        st.live[run_id].cancel.cancel();
                        true
                    }
                    Some(RunState::Queued { .. }) => {
                        if let Some(r) = self.stop_queued(&mut st, run_id, QUEUED_STOP) {
                            return Ok(r);
                        }
                        false
                    }
                }
            };
            if running {
                return self.wait(run_id, STOP_WAIT).await;
            }
            if let Some(r) = self.dispatch().stop(self, run_id).await? {
                return Ok(r);
            }
            // It came here meanwhile: stopped here.
        }
        self.stored_report(run_id).await
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

    /// Give back what was placed elsewhere and has not started ([`Dispatch::closing`]),
    /// [`RunManager::close`], stop every queued and running run, and wait (up to `grace` for
    /// the stops, and as long again for the removals) until their containers are gone.
    pub async fn shutdown(&self, grace: Duration) {
        if tokio::time::timeout(grace, self.dispatch().closing(self))
            .await
            .is_err()
        {
            tracing::warn!(
                "the runs placed elsewhere that had not started could not be given back in time"
            );
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

    /// Drain: refuse new runs and sessions, let every queued and
    /// running run finish, and return once none is left (`true`) or `limit` has passed.
    /// [`RunManager::shutdown`] then stops what is left.
    pub async fn drain(&self, limit: Duration) -> bool {
        let left = {
            let mut st = self.lock();
            st.admission.drain();
            st.live.len()
        };
        tracing::info!(
            runs = left,
            "draining: no new runs; waiting for the queued and running ones to finish"
        );
        self.dispatch().closing(self).await;
        let idle = async {
            loop {
                let left = self.inner.left.notified();
                tokio::pin!(left);
                left.as_mut().enable();
                if self.lock().live.is_empty() {
                    // And what is on its way here has come (or gone elsewhere).
                    self.dispatch().arrived(None).await;
                    if self.lock().live.is_empty() {
                        return;
                    }
                    continue;
                }
                left.await;
            }
        };
        tokio::time::timeout(limit, idle).await.is_ok()
    }

    /// Take back the runs placed elsewhere that have not started (a drain or a shutdown
    /// gives them back: [`Dispatch::closing`]); they leave without a report. Their ids.
    pub fn give_back_unstarted(&self) -> Vec<String> {
        let ids = self
            .lock()
            .take_out_unstarted_elsewhere(self.inner.executor.pool());
        self.inner.left.notify_waiters();
        ids
    }

    /// The runs held here unfinished.
    pub fn unfinished(&self) -> Vec<String> {
        self.lock().live.keys().cloned().collect()
    }

    /// The runs that ended here within `within`.
    pub fn ended_within(&self, within: Duration) -> Vec<String> {
        self.lock().retention.ended_within(within)
    }

    /// Whoever keeps the record decided `report` for this run meanwhile (the others, while
    /// this server's lease was judged lapsed): an unfinished run is stopped and answers with
    /// it; a finished one answers with it from now on. Whether anything changed.
    pub fn overrule(&self, report: RunReport) -> bool {
        let mut st = self.lock();
        let id = report.run_id.clone();
        match st.overrule(report) {
            Some(true) => {
                self.stop_queued(&mut st, &id, QUEUED_STOP);
            }
            Some(false) => {}
            None => return false,
        }
        self.pump(&mut st);
        true
    }

    /// Whether the server is draining (its `/healthz` says so, for a balancer).
    pub fn is_draining(&self) -> bool {
        self.lock().admission.is_draining()
    }

    // ---- taking requests: validated, charged, given an id, recorded, queued

    /// Validate a request and queue it. Returns at once; the run starts when admitted.
    pub fn submit(&self, req: RunRequest) -> Result<Accepted, SubmitError> {
        self.submit_with(req, self.new_feed(), false)
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
        let request = req.clone();
        let valid = ValidRequest::new(req, &self.inner.registry, &self.inner.config)?;
        let slots = parallelism(&valid, &self.inner.config);
        let charge_mb = run_charge(&valid, &self.inner.config, slots);
        budget::fits(&valid, &self.inner.config, charge_mb)?;
        let run = Submission {
            request,
            valid,
            slots,
            charge_mb,
            feed,
            interactive,
        };
        self.dispatch().place(self, run)
    }

    /// A run's history row, as this server records it.
    pub fn history_row(&self, run_id: &str, valid: &ValidRequest) -> NewRun {
        NewRun::new(
            run_id,
            &valid.language.id,
            valid.limits,
            &valid.code,
            self.inner.config.history.code,
            self.inner.executor.instance(),
        )
    }

    /// Queue a new run here, under a new id ([`Dispatch::place`]'s local answer).
    pub fn enqueue(&self, run: Submission) -> Result<Accepted, SubmitError> {
        self.enqueue_as(Queued {
            run_id: new_run_id(),
            valid: run.valid,
            slots: run.slots,
            charge_mb: run.charge_mb,
            feed: run.feed,
            origin: Origin::New,
        })
    }

    /// Queue a run accepted before it came here, ahead of the queue's limit (it was
    /// accepted); refused only once closed.
    pub fn take(&self, run: Taken) -> Result<Accepted, SubmitError> {
        let slots = parallelism(&run.valid, &self.inner.config);
        let charge_mb = run_charge(&run.valid, &self.inner.config, slots);
        self.enqueue_as(Queued {
            run_id: run.run_id,
            valid: run.valid,
            slots,
            charge_mb,
            feed: run.feed,
            origin: Origin::Taken {
                waited_ms: run.waited_ms,
                elsewhere: run.placed_elsewhere,
            },
        })
    }

    /// A new live feed for a run, of this manager's size.
    pub fn new_feed(&self) -> Arc<Feed> {
        Feed::new(self.feed_bytes())
    }

    /// Queue a job: a run its submitter carries out (one slot, `job.charge_mb`, one at a
    /// time per `job.serial`). Refused as a run is; its work is then dropped unrun.
    pub fn submit_job(&self, job: Job) -> Result<Accepted, SubmitError> {
        self.enqueue_as(Queued {
            run_id: job.run_id,
            valid: job.request,
            slots: 1,
            charge_mb: job.charge_mb,
            feed: self.new_feed(),
            origin: Origin::Job {
                serial: job.serial,
                at: job.at,
                work: job.work,
            },
        })
    }

    fn enqueue_as(&self, q: Queued) -> Result<Accepted, SubmitError> {
        self.purge_expired();
        let (run_id, limits, language) =
            (q.run_id.clone(), q.valid.limits, q.valid.language.clone());
        // The history row (its code hash) is made before the lock is taken; one placed
        // elsewhere was recorded there.
        let history = self
            .inner
            .history
            .as_ref()
            .filter(|_| !q.recorded_elsewhere());
        let row = history.map(|_| self.history_row(&run_id, &q.valid));
        let (live, row, taken) = Live::queued(q, row, &self.inner.config);
        let mut st = self.lock();
        if let Err(refusal) = st.enqueue(live, taken) {
            drop(st);
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
        self.inner
            .executor
            .pool()
            .asked(&language, &st.live[&run_id].shapes);
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

    /// The final report of a run that is not in memory ([`lookup::stored`]).
    pub async fn stored_report(&self, run_id: &str) -> Result<RunReport, LookupError> {
        let retention = self.retention();
        let evicted_live = self.lock().retention.evicted_within(run_id, retention);
        let at = lookup::Where {
            history: self.inner.history.as_ref(),
            instance: self.inner.executor.instance(),
            dispatch: self.dispatch(),
            retention,
            retained_reports_mb: self.inner.config.runs.retained_reports_mb,
        };
        lookup::stored(at, run_id, evicted_live).await
    }

    /// Whether this manager holds run `run_id` (queued, running, or its report kept here).
    pub fn holds(&self, run_id: &str) -> bool {
        let st = self.lock();
        st.live.contains_key(run_id) || st.retention.get(run_id).is_some()
    }

    /// Whether this server answers for run `run_id`: it holds it, or it is on its way here.
    pub fn holds_run(&self, run_id: &str) -> bool {
        self.holds(run_id) || self.dispatch().arriving(run_id)
    }

    // ---- room for runs on their way here

    /// Promise room to runs on their way here, under `key`, so that runs submitted
    /// meanwhile do not count on it too: `want` if it is free now, or (`None`) all that is
    /// free. What was promised, if anything. [`RunManager::unpromise`] ends it.
    pub fn promise(&self, key: &str, want: Option<Room>) -> Option<Room> {
        self.lock().promise(key, want)
    }

    /// End the promise made under `key`.
    pub fn unpromise(&self, key: &str) {
        self.lock().promised.remove(key);
    }

    pub fn stats(&self) -> Stats {
        self.lock().stats(&self.inner.executor)
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
            return st.hold_ahead(mb, pool.memory_mb());
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
        let message = format!("stopped before it started: {message}");
        for run_id in run_ids {
            if self.stop_queued(&mut st, run_id, &message).is_none() {
                if let Some(run) = st.live.get(run_id) {
                    run.cancel.cancel();
                }
            }
        }
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

/// A [`RunManager`] held weakly, by a loop that must not keep it alive.
#[derive(Clone)]
pub struct WeakRunManager(Weak<Inner>);

impl WeakRunManager {
    pub fn upgrade(&self) -> Option<RunManager> {
        self.0.upgrade().map(|inner| RunManager { inner })
    }
}
