//! The run manager: ids, a bounded FIFO admission queue, a concurrency cap and a memory
//! budget, stop, and retention of finished reports.
//!
//! Admission is strictly first in, first out: only the head of the queue may start, and it
//! starts when both a slot is free (`runs.max_concurrent_runs`) and the memory of the running
//! runs plus its own stays within `runs.memory_budget_mb`. A large request at the head is
//! therefore never starved by small ones behind it. A run is charged the larger of its memory
//! limit and its language's compile-stage limit, since the stages run one after the other
//! (their tmpfs working directories are memory within those limits).
//!
//! Each run executes in its own tokio task, watched by a second task: if the first panics,
//! the run still ends, as `sandbox_error` (the executor's guards remove its containers).
//!
//! Finished reports are kept for `runs.result_retention_seconds`, but memory holds at most
//! `runs.retained_reports_mb` of them (outputs plus [`REPORT_OVERHEAD_BYTES`] each): beyond
//! that the oldest leave memory, and `get_result`/`stop_run` read them back from the history
//! database, which stores every final report until its retention passes. Without a working
//! history an evicted report is gone, and asking for it is an error naming the setting: the
//! memory bound wins over keeping every report.
//!
//! Several servers may share one history database (PostgreSQL). A run another server accepted
//! is answered from the database once it has ended; while it is unfinished there, the answer
//! is [`LookupError::Elsewhere`], naming that server, and `wait` looks again until the end.

pub mod metrics;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::executor::pool::Pool;
use crate::executor::{new_run_id, parallelism, Executor, RequestError, RunRequest, ValidRequest};
use crate::history::{now_ms, History, NewRun};
use crate::registry::{Language, Registry};
use crate::report::{RunLimits, RunReport, Status};
pub use metrics::Metrics;

/// How often `get_result` with `wait_seconds` looks again at a run another server holds.
const ELSEWHERE_POLL: Duration = Duration::from_millis(500);
/// How long `get_result` with `wait_seconds` looks again for a run id the history does not
/// know yet: another server sharing it may have accepted the run a moment ago (its history
/// writes trail its answers).
const UNKNOWN_GRACE: Duration = Duration::from_secs(2);
/// How often it looks during that grace.
const UNKNOWN_POLL: Duration = Duration::from_millis(100);
/// How long `stop` waits for a running run's containers to be killed and removed.
const STOP_WAIT: Duration = Duration::from_secs(120);
/// How often finished reports past their retention are dropped.
const PURGE_INTERVAL: Duration = Duration::from_secs(60);
/// Memory charged per finished report besides its outputs: ids, message, limits, bookkeeping.
pub const REPORT_OVERHEAD_BYTES: u64 = 1024;

/// What a finished report counts against `runs.retained_reports_mb`: its stdout, stderr,
/// compile output, message, returned files and test cases' output, plus
/// [`REPORT_OVERHEAD_BYTES`].
pub fn report_bytes(r: &RunReport) -> u64 {
    let compile = r
        .compile
        .as_ref()
        .map_or(0, |c| c.stdout.len() + c.stderr.len());
    let files: usize = r
        .files
        .iter()
        .map(|f| f.path.len() + f.content_base64.as_ref().map_or(0, String::len))
        .sum();
    let tests: usize = r
        .tests
        .iter()
        .map(|t| t.name.len() + t.stdout.len() + t.stderr.len())
        .sum();
    (r.stdout.len() + r.stderr.len() + compile + r.message.len() + files + tests) as u64
        + REPORT_OVERHEAD_BYTES
}

/// A run accepted by [`RunManager::submit`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Accepted {
    /// Id to pass to `get_result` and `stop_run`.
    pub run_id: String,
    /// `queued` (waiting for a slot) or `running`.
    pub status: Status,
    /// The limits the run was given (defaults filled in).
    pub limits: RunLimits,
}

/// Why a run was not accepted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SubmitError {
    /// The request itself is wrong; the error names the field.
    #[error(transparent)]
    Invalid(#[from] RequestError),
    /// Too many runs are waiting. Retryable.
    #[error("the server is busy: {waiting} runs are already waiting for a slot (the queue holds at most {max}); retry in a few seconds")]
    QueueFull { waiting: usize, max: usize },
    /// The server is shutting down.
    #[error("the server is shutting down and accepts no new runs")]
    ShuttingDown,
}

impl SubmitError {
    /// Whether the same request may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, SubmitError::QueueFull { .. })
    }
}

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

/// Counts for tests, `/metrics` and the logs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub queued: usize,
    pub active: usize,
    pub active_memory_mb: u64,
    /// The most runs that were ever executing at once.
    pub peak_active: usize,
    /// Finished runs whose reports are still kept in memory.
    pub retained: usize,
    /// Their size as counted against `runs.retained_reports_mb` ([`report_bytes`]).
    pub retained_report_bytes: u64,
    /// Finished runs within the retention whose reports were evicted from memory.
    pub evicted: usize,
    /// Containers ready in the pool, and the pool's counters.
    pub pool: PoolSnapshot,
}

/// What the pool holds and has done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolSnapshot {
    pub stats: crate::executor::pool::PoolStats,
    pub hits: u64,
    pub updated_hits: u64,
    pub misses: u64,
    pub created: u64,
    pub failed: u64,
    pub expired: u64,
}

enum Phase {
    Queued {
        request: Box<ValidRequest>,
    },
    Running {
        started: Instant,
    },
    Done {
        report: Arc<RunReport>,
        ended: Instant,
    },
}

struct Run {
    /// The report before anything happened (status `queued`).
    base: RunReport,
    charge_mb: u64,
    /// Containers it runs at once (test cases): the concurrency slots it takes.
    slots: usize,
    budget: Duration,
    accepted: Instant,
    phase: Phase,
    cancel: CancellationToken,
    done: watch::Sender<Option<Arc<RunReport>>>,
}

#[derive(Default)]
struct State {
    runs: HashMap<String, Run>,
    queue: VecDeque<String>,
    /// Finished runs still in `runs`, oldest end first (runs end under the lock, in order).
    done: VecDeque<String>,
    /// What the reports of `done` count against `runs.retained_reports_mb`.
    retained_bytes: u64,
    /// Runs whose report was evicted from memory, with their end, until their retention
    /// passes: by id, and oldest end first.
    evicted: HashMap<String, Instant>,
    evicted_order: VecDeque<String>,
    active: usize,
    active_memory_mb: u64,
    peak_active: usize,
    shutting_down: bool,
}

struct Inner {
    executor: Arc<Executor>,
    registry: Arc<Registry>,
    config: Arc<Config>,
    history: Option<History>,
    metrics: Metrics,
    state: Mutex<State>,
}

/// The run manager. Cheap to clone; all clones share the same runs.
#[derive(Clone)]
pub struct RunManager {
    inner: Arc<Inner>,
}

/// Memory a run holds while admitted: its own limit (times the test cases it runs at once),
/// or its compile stage's if larger (the stages' working directories are tmpfs within those
/// limits).
pub fn memory_charge(language: &Language, limits: &RunLimits, parallel: usize) -> u64 {
    let run = limits.memory_mb * parallel as u64;
    if language.is_compiled() {
        run.max(language.compile_limits.memory_mb)
    } else {
        run
    }
}

/// Check that every language's compile stage fits the memory budget (at start).
pub fn check_budget(registry: &Registry, config: &Config) -> Result<(), String> {
    let budget = config.runs.memory_budget_mb;
    for lang in registry.languages.values() {
        let compile_mb = lang.compile_limits.memory_mb;
        if lang.is_compiled() && compile_mb > budget {
            return Err(format!(
                "setting `runs.memory_budget_mb` = {budget} is invalid: language `{}` compiles with {compile_mb} MB, which would never fit",
                lang.id
            ));
        }
    }
    Ok(())
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
        let inner = Arc::new(Inner {
            executor,
            registry,
            config,
            history,
            metrics: Metrics::default(),
            state: Mutex::new(State::default()),
        });
        let manager = RunManager { inner };
        manager.sweep_history();
        tokio::spawn(purge_loop(Arc::downgrade(&manager.inner)));
        manager
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

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves consistent data (every update is a few
        // assignments), so a poisoned lock is used as is.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Validate a request and queue it. Returns at once; the run starts when admitted.
    pub fn submit(&self, req: RunRequest) -> Result<Accepted, SubmitError> {
        let code_for_history = req.code.clone();
        let valid = ValidRequest::new(req, &self.inner.registry, &self.inner.config)?;
        let policy = &self.inner.config.runs;
        let slots = parallelism(&valid, &self.inner.config);
        let charge_mb = memory_charge(&valid.language, &valid.limits, slots);
        if charge_mb > policy.memory_budget_mb {
            return Err(SubmitError::Invalid(RequestError {
                field: "limits.memory_mb".into(),
                message: format!(
                    "requested {} MB of memory; this server runs at most {} MB of runs at once, so the maximum here is {} MB",
                    valid.limits.memory_mb, policy.memory_budget_mb, policy.memory_budget_mb
                ),
            }));
        }
        self.purge_expired();
        let run_id = new_run_id();
        let mut st = self.lock();
        if st.shutting_down {
            return Err(SubmitError::ShuttingDown);
        }
        let starts_now = st.queue.is_empty()
            && st.active + slots <= policy.max_concurrent_runs
            && st.active_memory_mb + charge_mb <= policy.memory_budget_mb;
        if !starts_now && st.queue.len() >= policy.max_queued_runs {
            self.inner.metrics.rejected_queue_full();
            return Err(SubmitError::QueueFull {
                waiting: st.queue.len(),
                max: policy.max_queued_runs,
            });
        }
        let base = Executor::blank_report(&run_id, &valid);
        let limits = valid.limits;
        let budget = Duration::from_secs_f64(
            limits.timeout_seconds
                + if valid.language.can_fail_to_compile() {
                    valid.language.compile_limits.timeout_seconds
                } else {
                    0.0
                },
        );
        if let Some(h) = &self.inner.history {
            h.insert(NewRun::new(
                &run_id,
                &valid.language.id,
                limits,
                &code_for_history,
                self.inner.config.history.code,
                self.inner.executor.instance(),
            ));
        }
        let (done, _) = watch::channel(None);
        st.runs.insert(
            run_id.clone(),
            Run {
                base,
                charge_mb,
                slots,
                budget,
                accepted: Instant::now(),
                phase: Phase::Queued {
                    request: Box::new(valid),
                },
                cancel: CancellationToken::new(),
                done,
            },
        );
        st.queue.push_back(run_id.clone());
        self.pump(&mut st);
        let status = match st.runs.get(&run_id).map(|r| &r.phase) {
            Some(Phase::Queued { .. }) => Status::Queued,
            _ => Status::Running,
        };
        Ok(Accepted {
            run_id,
            status,
            limits,
        })
    }

    /// Start runs from the head of the queue while a slot and memory are free.
    fn pump(&self, st: &mut State) {
        let policy = &self.inner.config.runs;
        let pool = self.inner.executor.pool();
        while let Some(head) = st.queue.front() {
            let Some(run) = st.runs.get(head) else {
                st.queue.pop_front();
                continue;
            };
            if st.active + run.slots > policy.max_concurrent_runs {
                break;
            }
            let need = st.active_memory_mb + run.charge_mb;
            if need > policy.memory_budget_mb {
                break;
            }
            // Containers waiting in the pool hold budget too; a queued run gets it back.
            let pooled = pool.memory_mb();
            if need + pooled > policy.memory_budget_mb {
                pool.shed(need + pooled - policy.memory_budget_mb);
                if need + pool.memory_mb() > policy.memory_budget_mb {
                    break;
                }
            }
            let run_id = st.queue.pop_front().expect("head exists");
            let run = st.runs.get_mut(&run_id).expect("queued run exists");
            let now = Instant::now();
            let Phase::Queued { request } =
                std::mem::replace(&mut run.phase, Phase::Running { started: now })
            else {
                continue;
            };
            let queued_ms = now.duration_since(run.accepted).as_millis() as u64;
            let cancel = run.cancel.clone();
            st.active += run.slots;
            st.active_memory_mb += run.charge_mb;
            st.peak_active = st.peak_active.max(st.active);
            if let Some(h) = &self.inner.history {
                h.started(&run_id);
            }
            self.launch(run_id, *request, queued_ms, cancel);
        }
        self.refill(st);
    }

    /// Start filling the pool where it is short, while no run waits and the budget allows.
    fn refill(&self, st: &State) {
        if !st.queue.is_empty() || st.shutting_down {
            return;
        }
        let pool = self.inner.executor.pool();
        let budget = self.inner.config.runs.memory_budget_mb;
        while let Some(shape) = pool.wanted() {
            if st.active_memory_mb + pool.memory_mb() + shape.memory_mb > budget {
                break;
            }
            pool.fill(shape);
        }
    }

    /// Keep containers ready for the languages of `pool.sizes` (`codebox serve`): fill the
    /// pool now and whenever it runs short, and replace containers that waited too long.
    pub fn start_pool(&self) {
        let pool = self.inner.executor.pool();
        let targets = Pool::targets_for(&self.inner.registry, &self.inner.config);
        if targets.is_empty() {
            return;
        }
        pool.set_targets(targets);
        self.refill(&self.lock());
        tokio::spawn(pool_loop(Arc::downgrade(&self.inner)));
    }

    fn launch(
        &self,
        run_id: String,
        request: ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
    ) {
        let executor = self.inner.executor.clone();
        let id = run_id.clone();
        let task =
            tokio::spawn(async move { executor.execute(&id, &request, queued_ms, cancel).await });
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
            manager.finish(&run_id, outcome);
        });
    }

    /// Record a run's end, free its slot and memory, wake waiters, start what can start.
    fn finish(&self, run_id: &str, outcome: Result<RunReport, String>) {
        let mut st = self.lock();
        self.finish_locked(&mut st, run_id, outcome);
    }

    fn finish_locked(&self, st: &mut State, run_id: &str, outcome: Result<RunReport, String>) {
        let Some(run) = st.runs.get_mut(run_id) else {
            return;
        };
        if matches!(run.phase, Phase::Done { .. }) {
            return;
        }
        let report = match outcome {
            Ok(r) => r,
            Err(message) => {
                tracing::error!(run_id, %message, "a run's task failed");
                let mut r = run.base.clone();
                r.status = Status::SandboxError;
                r.message = message;
                if let Phase::Running { started } = run.phase {
                    r.duration_ms = started.elapsed().as_millis() as u64;
                }
                r
            }
        };
        let was_running = matches!(run.phase, Phase::Running { .. });
        let report = Arc::new(report);
        run.phase = Phase::Done {
            report: report.clone(),
            ended: Instant::now(),
        };
        let (charge, slots) = (run.charge_mb, run.slots);
        if let Some(h) = &self.inner.history {
            h.finish(report.clone());
        }
        self.inner.metrics.record(&report);
        st.retained_bytes += report_bytes(&report);
        run.done.send_replace(Some(report));
        st.done.push_back(run_id.to_string());
        if was_running {
            st.active -= slots;
            st.active_memory_mb -= charge;
        }
        self.evict_over_budget(st);
        self.pump(st);
    }

    /// Move the oldest finished reports out of memory until the rest fit
    /// `runs.retained_reports_mb`. Waiters already woken keep their copy (the watch channel's).
    fn evict_over_budget(&self, st: &mut State) {
        let budget = self
            .inner
            .config
            .runs
            .retained_reports_mb
            .saturating_mul(1024 * 1024);
        while st.retained_bytes > budget {
            let Some(id) = st.done.pop_front() else { break };
            let Some(run) = st.runs.remove(&id) else {
                continue;
            };
            let Phase::Done { report, ended } = run.phase else {
                continue;
            };
            st.retained_bytes = st.retained_bytes.saturating_sub(report_bytes(&report));
            st.evicted.insert(id.clone(), ended);
            st.evicted_order.push_back(id);
            self.inner.metrics.report_evicted();
        }
    }

    /// The run's report from memory: final, or in progress (`queued`/`running`, with times
    /// so far). `None` for an unknown, expired or evicted run id ([`RunManager::wait`] also
    /// asks the history database).
    pub fn report(&self, run_id: &str) -> Option<RunReport> {
        let st = self.lock();
        let run = st.runs.get(run_id)?;
        Some(match &run.phase {
            Phase::Done { report, .. } => (**report).clone(),
            Phase::Queued { .. } => {
                let mut r = run.base.clone();
                let pos = st
                    .queue
                    .iter()
                    .position(|id| id == run_id)
                    .map_or(0, |p| p + 1);
                r.queued_ms = run.accepted.elapsed().as_millis() as u64;
                r.message = format!(
                    "waiting for a free slot: number {pos} of {} in the queue",
                    st.queue.len()
                );
                r
            }
            Phase::Running { started } => {
                let mut r = run.base.clone();
                r.status = Status::Running;
                r.queued_ms = started.duration_since(run.accepted).as_millis() as u64;
                r.duration_ms = started.elapsed().as_millis() as u64;
                r.message = format!("running for {:.1} s", started.elapsed().as_secs_f64());
                r
            }
        })
    }

    /// Where an unfinished run stands; `None` when unknown.
    pub fn progress(&self, run_id: &str) -> Option<Progress> {
        let st = self.lock();
        let run = st.runs.get(run_id)?;
        let (status, queue_position) = match &run.phase {
            Phase::Queued { .. } => (
                Status::Queued,
                st.queue.iter().position(|id| id == run_id).map(|p| p + 1),
            ),
            Phase::Running { .. } => (Status::Running, None),
            Phase::Done { report, .. } => (report.status, None),
        };
        Some(Progress {
            status,
            elapsed: run.accepted.elapsed(),
            queue_position,
            budget: run.budget,
        })
    }

    /// Wait up to `timeout` for the run to end, then return its report as it stands. A run
    /// not in memory is looked up in the history database (see [`LookupError`]).
    pub async fn wait(&self, run_id: &str, timeout: Duration) -> Result<RunReport, LookupError> {
        let rx = self.lock().runs.get(run_id).map(|r| r.done.subscribe());
        let Some(mut rx) = rx else {
            return self.wait_in_store(run_id, timeout).await;
        };
        if !timeout.is_zero() {
            let _ = tokio::time::timeout(timeout, rx.wait_for(|r| r.is_some())).await;
        }
        // The final report, even if it has just been evicted from memory.
        let finished = rx.borrow().clone();
        if let Some(report) = finished {
            return Ok((*report).clone());
        }
        match self.report(run_id) {
            Some(r) => Ok(r),
            None => self.stored_report(run_id).await,
        }
    }

    /// A run not in memory: its stored report; or, while another server holds it unfinished,
    /// look again every [`ELSEWHERE_POLL`] until it has ended or `timeout` has passed. An id
    /// the history does not know is looked for again during [`UNKNOWN_GRACE`] (within
    /// `timeout`).
    async fn wait_in_store(
        &self,
        run_id: &str,
        timeout: Duration,
    ) -> Result<RunReport, LookupError> {
        let start = Instant::now();
        let deadline = start + timeout;
        let grace = start + timeout.min(UNKNOWN_GRACE);
        loop {
            let outcome = self.stored_report(run_id).await;
            let now = Instant::now();
            let pause = match &outcome {
                Err(LookupError::Elsewhere { .. }) if now < deadline => ELSEWHERE_POLL,
                Err(LookupError::Unknown { .. }) if now < grace && self.inner.history.is_some() => {
                    UNKNOWN_POLL
                }
                _ => return outcome,
            };
            tokio::time::sleep(pause.min(deadline.saturating_duration_since(now))).await;
        }
    }

    /// Stop a run: a queued one ends `stopped` at once; a running one is killed and its
    /// containers removed before this returns. A finished run keeps its final report.
    pub async fn stop(&self, run_id: &str) -> Result<RunReport, LookupError> {
        let running = {
            let mut st = self.lock();
            match st.runs.get_mut(run_id) {
                None => false,
                Some(run) => match run.phase {
                    Phase::Done { ref report, .. } => return Ok((**report).clone()),
                    Phase::Running { .. } => {
                        run.cancel.cancel();
                        true
                    }
                    Phase::Queued { .. } => {
                        let mut r = run.base.clone();
                        r.status = Status::Stopped;
                        r.queued_ms = run.accepted.elapsed().as_millis() as u64;
                        r.message = "stopped while waiting in the queue; it never started".into();
                        st.queue.retain(|id| id != run_id);
                        self.finish_locked(&mut st, run_id, Ok(r.clone()));
                        return Ok(r);
                    }
                },
            }
        };
        if running {
            self.wait(run_id, STOP_WAIT).await
        } else {
            self.stored_report(run_id).await
        }
    }

    /// The final report of a run that is not in memory: evicted (within the retention), or
    /// finished by an earlier server on the same history database. Either comes from the
    /// history while its retention lasts; anything else is unknown.
    async fn stored_report(&self, run_id: &str) -> Result<RunReport, LookupError> {
        let retention = self.retention();
        let evicted_live = self
            .lock()
            .evicted
            .get(run_id)
            .map(|ended| ended.elapsed() < retention);
        let unknown = || LookupError::Unknown {
            run_id: run_id.to_string(),
            retention_seconds: retention.as_secs(),
        };
        let evicted = |detail: String| LookupError::Evicted {
            run_id: run_id.to_string(),
            retained_reports_mb: self.inner.config.runs.retained_reports_mb,
            detail,
        };
        let history = self.inner.history.as_ref();
        match (evicted_live, history) {
            (Some(false), _) | (None, None) => Err(unknown()),
            (None, Some(h)) => {
                let since = now_ms().saturating_sub(retention.as_millis() as i64);
                match h.report(run_id, Some(since)).await {
                    Ok(Some(r)) => Ok(r),
                    Ok(None) => Err(self.held_elsewhere(h, run_id).await.unwrap_or_else(unknown)),
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
                    "the history database holds no copy of it (its write failed; see the log)"
                        .into(),
                )),
                Err(e) => Err(evicted(e.to_string())),
            },
        }
    }

    /// [`LookupError::Elsewhere`] if the history says another instance holds the run
    /// unfinished.
    async fn held_elsewhere(&self, history: &History, run_id: &str) -> Option<LookupError> {
        let w = match history.whereabouts(run_id).await {
            Ok(w) => w?,
            Err(e) => {
                tracing::warn!(run_id, error = %e, "cannot look up a run in the history");
                return None;
            }
        };
        if w.status.is_terminal() || w.instance == self.inner.executor.instance() {
            return None;
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
        Some(LookupError::Elsewhere {
            run_id: run_id.to_string(),
            status: w.status,
            owner,
        })
    }

    pub fn stats(&self) -> Stats {
        let pool = self.inner.executor.pool();
        let c = pool.counters();
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        let pool = PoolSnapshot {
            stats: pool.stats(),
            hits: load(&c.hits),
            updated_hits: load(&c.updated_hits),
            misses: load(&c.misses),
            created: load(&c.created),
            failed: load(&c.failed),
            expired: load(&c.expired),
        };
        let st = self.lock();
        Stats {
            pool,
            queued: st.queue.len(),
            active: st.active,
            active_memory_mb: st.active_memory_mb,
            peak_active: st.peak_active,
            retained: st.done.len(),
            retained_report_bytes: st.retained_bytes,
            evicted: st.evicted.len(),
        }
    }

    /// Forget finished runs whose retention passed, in memory and (their full reports; the
    /// metadata stays) in the history database.
    pub fn purge_expired(&self) {
        let keep = self.retention();
        let forgotten = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let mut gone = Vec::new();
            while let Some(id) = st.done.front() {
                // `done` only holds finished runs; anything else would be a stale entry.
                let (expired, bytes) = match st.runs.get(id).map(|r| &r.phase) {
                    Some(Phase::Done { ended, report }) => {
                        (ended.elapsed() >= keep, Some(report_bytes(report)))
                    }
                    _ => (true, None),
                };
                if !expired {
                    break;
                }
                let id = st.done.pop_front().expect("front exists");
                if let Some(bytes) = bytes {
                    st.runs.remove(&id);
                    st.retained_bytes = st.retained_bytes.saturating_sub(bytes);
                    gone.push(id);
                }
            }
            while let Some(id) = st.evicted_order.front() {
                if st
                    .evicted
                    .get(id)
                    .is_some_and(|ended| ended.elapsed() < keep)
                {
                    break;
                }
                let id = st.evicted_order.pop_front().expect("front exists");
                st.evicted.remove(&id);
                gone.push(id);
            }
            gone
        };
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

    /// Refuse new runs, stop every queued and running one, and wait (up to `grace`) until
    /// their containers are gone.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner.executor.pool().close();
        let ids: Vec<String> = {
            let mut st = self.lock();
            st.shutting_down = true;
            st.runs
                .iter()
                .filter(|(_, r)| !matches!(r.phase, Phase::Done { .. }))
                .map(|(id, _)| id.clone())
                .collect()
        };
        if ids.is_empty() {
            return;
        }
        tracing::info!(runs = ids.len(), "stopping unfinished runs");
        let stops = ids.iter().map(|id| self.stop(id));
        let _ = tokio::time::timeout(grace, futures_util::future::join_all(stops)).await;
    }
}

/// How often the pool is checked for containers to replace or add.
const POOL_INTERVAL: Duration = Duration::from_millis(500);

async fn pool_loop(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(POOL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let manager = RunManager { inner };
        manager.inner.executor.pool().expire();
        let st = manager.lock();
        if st.shutting_down {
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn a_compiled_run_is_charged_its_larger_stage() {
        let registry = Registry::parse(
            Path::new("t.toml"),
            r#"
[images.i]
tag = "t"
context = "images/i"

[languages.plain]
display_name = "P"
image = "i"
source_file = "main.p"
run = ["p", "main.p"]

[languages.heavy]
display_name = "H"
image = "i"
source_file = "main.h"
compile = ["cc"]
run = ["./main"]
compile_limits = { memory_mb = 1024, workspace_mb = 256 }
"#,
        )
        .unwrap();
        let limits = RunLimits {
            memory_mb: 512,
            timeout_seconds: 1.0,
            cpus: 1.0,
        };
        assert_eq!(memory_charge(&registry.languages["plain"], &limits, 1), 512);
        assert_eq!(
            memory_charge(&registry.languages["heavy"], &limits, 1),
            1024
        );
        assert_eq!(
            memory_charge(&registry.languages["heavy"], &limits, 3),
            1536,
            "three test cases at once"
        );
    }
}
