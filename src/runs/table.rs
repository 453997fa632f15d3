//! The run table: what the manager knows of each run it holds, and the views of it that need
//! only the table (a report as it stands, progress, free room).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admission::{Admission, Policy, Refusal, Ticket};
use super::retention::Retention;
use super::Stats;
use super::Work;
use crate::config::Config;
use crate::contract::ValidRequest;
use crate::executor::pool::{shapes_of, Pool, Shape};
use crate::executor::Executor;
use crate::history::NewRun;
use crate::live::Feed;
use crate::report::{RunReport, Status};

/// How a run came to the queue.
pub(super) enum Origin {
    /// Submitted here.
    New,
    /// Accepted before it came here ([`super::Taken`]).
    Taken { waited_ms: u64, elsewhere: bool },
    /// A job: carried out by its submitter.
    Job {
        serial: String,
        at: crate::report::SessionExecution,
        work: Box<dyn Work>,
    },
}

/// What a run being queued is, beside its request.
pub(super) struct Queued {
    pub(super) run_id: String,
    pub(super) valid: ValidRequest,
    pub(super) slots: usize,
    pub(super) charge_mb: u64,
    pub(super) feed: Arc<Feed>,
    pub(super) origin: Origin,
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
pub(super) enum RunState {
    Queued { request: Box<ValidRequest> },
    Running { started: Instant },
}

/// A run not finished yet.
pub(super) struct Live {
    /// The report before anything happened (status `queued`).
    pub(super) base: RunReport,
    /// What admission charged it (slots, memory, its serial key).
    pub(super) ticket: Ticket,
    /// The containers it asked the pool for, by shape (none for a job).
    pub(super) shapes: Vec<(Shape, usize)>,
    /// A job's work, until it starts.
    pub(super) work: Option<Box<dyn Work>>,
    pub(super) budget: Duration,
    pub(super) accepted: Instant,
    pub(super) state: RunState,
    pub(super) cancel: CancellationToken,
    pub(super) done: watch::Sender<Option<Arc<RunReport>>>,
    /// Its live events (output as it comes), ended with the report.
    pub(super) feed: Arc<Feed>,
    /// Placed elsewhere: it starts only once the dispatch confirms it ([`super::Dispatch::confirm`]).
    pub(super) elsewhere: bool,
    /// The final report whoever keeps the record decided for it meanwhile: its report here
    /// too, whatever its task ends with ([`super::RunManager::overrule`]).
    pub(super) overruled: Option<RunReport>,
}

/// Slots and memory.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Room {
    pub slots: usize,
    pub memory_mb: u64,
}

pub(super) struct State {
    pub(super) live: HashMap<String, Live>,
    /// Room promised to runs on their way here ([`super::RunManager::promise`]), by key.
    pub(super) promised: HashMap<String, Room>,
    pub(super) admission: Admission,
    pub(super) retention: Retention,
}

impl State {
    pub(super) fn new(policy: Policy) -> State {
        State {
            live: HashMap::new(),
            promised: HashMap::new(),
            admission: Admission::new(policy),
            retention: Retention::default(),
        }
    }

    /// Queue `live` (one `taken` whatever the queue holds); refused, it is dropped.
    pub(super) fn enqueue(&mut self, live: Live, taken: bool) -> Result<(), Refusal> {
        let ticket = live.ticket.clone();
        if taken {
            self.admission.enqueue_taken(ticket)?;
        } else {
            self.admission.enqueue(ticket)?;
        }
        self.live.insert(live.ticket.run_id.clone(), live);
        Ok(())
    }

    /// [`super::RunManager::promise`].
    pub(super) fn promise(&mut self, key: &str, want: Option<Room>) -> Option<Room> {
        let free = self.room();
        let promised = match want {
            Some(w) if w.slots <= free.slots && w.memory_mb <= free.memory_mb => w,
            Some(_) => return None,
            None if free.slots > 0 && free.memory_mb > 0 => free,
            None => return None,
        };
        self.promised.insert(key.to_string(), promised);
        Some(promised)
    }

    /// Take the runs placed elsewhere that have not started out, without a report (their
    /// readers stop); their ids.
    pub(super) fn take_out_unstarted_elsewhere(&mut self, pool: &Pool) -> Vec<String> {
        let ids: Vec<String> = self
            .live
            .iter()
            .filter(|(_, r)| r.elsewhere && matches!(r.state, RunState::Queued { .. }))
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.admission.withdraw(id);
            if let Some(run) = self.live.remove(id) {
                pool.done(&run.shapes);
                run.feed.abandon();
            }
        }
        ids
    }

    /// [`super::RunManager::overrule`]: a running run is cancelled, and `Some(true)` says a
    /// queued one is to be stopped; a finished one's report is replaced (`Some(false)`)
    /// when it differs. `None`: nothing changed.
    pub(super) fn overrule(&mut self, report: RunReport) -> Option<bool> {
        let id = report.run_id.clone();
        if let Some(run) = self.live.get_mut(&id) {
            let queued = matches!(run.state, RunState::Queued { .. });
            if !queued {
                run.cancel.cancel();
            }
            run.overruled = Some(report);
            return Some(queued);
        }
        let mine = self.retention.get(&id)?;
        if mine.status == report.status && mine.message == report.message {
            return None;
        }
        self.retention.replace(&id, Arc::new(report));
        Some(false)
    }

    /// Hold `mb` for something opened ahead of time: only into room nobody waits for.
    pub(super) fn hold_ahead(&mut self, mb: u64, pooled_mb: u64) -> Result<(), String> {
        if self.admission.queued() > 0 || !self.admission.may_hold(mb, pooled_mb) {
            return Err("no room".into());
        }
        self.admission.hold_ahead(mb);
        Ok(())
    }

    /// The counts of the runs, and those of `executor`.
    pub(super) fn stats(&self, executor: &Executor) -> Stats {
        Stats {
            queued: self.admission.queued(),
            active: self.admission.active(),
            active_memory_mb: self.admission.active_memory_mb(),
            peak_active: self.admission.peak_active(),
            retained: self.retention.len(),
            retained_report_bytes: self.retention.bytes(),
            evicted: self.retention.evicted(),
            ..super::stats::of_executor(executor)
        }
    }

    /// What this manager could start now: admission's room, less what was promised.
    pub(super) fn room(&self) -> Room {
        let (slots, mb) = self.admission.room();
        let (ps, pm) = self
            .promised
            .values()
            .fold((0, 0), |(s, m), r| (s + r.slots, m + r.memory_mb));
        Room {
            slots: slots.saturating_sub(ps),
            memory_mb: mb.saturating_sub(pm),
        }
    }

    /// The run's report from memory: final, or in progress (`queued`/`running`, with times
    /// so far). `None` for an unknown, expired or evicted run id ([`super::RunManager::wait`] also
    /// asks the history database).
    pub(super) fn report(&self, run_id: &str) -> Option<RunReport> {
        if let Some(r) = self.retention.get(run_id) {
            return Some((**r).clone());
        }
        let run = self.live.get(run_id)?;
        let mut r = run.base.clone();
        match &run.state {
            RunState::Queued { .. } => {
                r.queued_ms = run.accepted.elapsed().as_millis() as u64;
                r.message = format!(
                    "waiting for a free slot: number {} of {} in the queue",
                    self.admission.position(run_id).unwrap_or(0),
                    self.admission.queued()
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

    /// Where an unfinished run stands; `None` when unknown or finished and forgotten.
    pub(super) fn progress(&self, run_id: &str) -> Option<Progress> {
        let Some(run) = self.live.get(run_id) else {
            let report = self.retention.get(run_id)?;
            return Some(Progress {
                status: report.status,
                elapsed: Duration::from_millis(report.queued_ms + report.duration_ms),
                queue_position: None,
                budget: Duration::ZERO,
            });
        };
        let (status, queue_position) = match &run.state {
            RunState::Queued { .. } => (Status::Queued, self.admission.position(run_id)),
            RunState::Running { .. } => (Status::Running, None),
        };
        Some(Progress {
            status,
            elapsed: run.accepted.elapsed(),
            queue_position,
            budget: run.budget,
        })
    }
}

impl Queued {
    /// Placed elsewhere, which recorded it.
    pub(super) fn recorded_elsewhere(&self) -> bool {
        matches!(
            self.origin,
            Origin::Taken {
                elsewhere: true,
                ..
            }
        )
    }
}

impl Live {
    /// A run entering the queue; its history row (`row`, if it is recorded here) as it is to
    /// be written, and whether it was taken (accepted before it came here).
    pub(super) fn queued(
        q: Queued,
        mut row: Option<NewRun>,
        config: &Config,
    ) -> (Live, Option<NewRun>, bool) {
        let elsewhere = q.recorded_elsewhere();
        let mut base = Executor::blank_report(&q.run_id, &q.valid);
        let (serial, work, waited_ms, taken) = match q.origin {
            Origin::New => (None, None, 0, false),
            Origin::Taken { waited_ms, .. } => (None, None, waited_ms, true),
            Origin::Job { serial, at, work } => {
                row = row.map(|r| r.in_session(&at.session_id, at.execution_count));
                base.session = Some(at);
                (Some(serial), Some(work), 0, false)
            }
        };
        // The pool follows what runs ask for (a job runs where its submitter says).
        let shapes = match work {
            None => shapes_of(&q.valid, config, q.slots),
            Some(_) => Vec::new(),
        };
        let now = Instant::now();
        let live = Live {
            base,
            ticket: Ticket {
                run_id: q.run_id,
                slots: q.slots,
                charge_mb: q.charge_mb,
                session: serial,
            },
            shapes,
            work,
            budget: Executor::budget(&q.valid),
            accepted: now
                .checked_sub(Duration::from_millis(waited_ms))
                .unwrap_or(now),
            state: RunState::Queued {
                request: Box::new(q.valid),
            },
            cancel: CancellationToken::new(),
            done: watch::channel(None).0,
            feed: q.feed,
            elsewhere,
            overruled: None,
        };
        (live, row, taken)
    }

    /// Its final report, from what its task ended with (`Err`: why the task failed), unless
    /// it was overruled ([`super::RunManager::overrule`]).
    pub(super) fn final_report(&self, outcome: Result<RunReport, String>) -> RunReport {
        let run_id = &self.base.run_id;
        let report = match outcome {
            Ok(report) => report,
            Err(message) => {
                tracing::error!(run_id, %message, "a run's task failed");
                let mut r = self.base.clone();
                r.status = Status::SandboxError;
                r.message = message;
                if let RunState::Running { started } = self.state {
                    r.duration_ms = started.elapsed().as_millis() as u64;
                }
                r
            }
        };
        match self.overruled.clone() {
            Some(theirs) => {
                tracing::warn!(
                    run_id,
                    here = report.status.as_str(),
                    kept = theirs.status.as_str(),
                    "a run held here ended after its report was decided elsewhere: that report stands"
                );
                theirs
            }
            None => report,
        }
    }

    /// Its report had it been stopped before it started, with `message`.
    pub(super) fn stopped(&self, queued_ms: u64, message: &str) -> RunReport {
        let mut r = self.base.clone();
        r.status = Status::Stopped;
        r.queued_ms = queued_ms;
        r.message = message.to_string();
        r
    }
}
