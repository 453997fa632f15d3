//! The cluster's dispatch (SPEC section 15): runs submitted to this server go to the queue
//! the servers share ([`SharedQueue`]), and this server claims from it what fits its own
//! slots and budget, this one's own submissions included; a run another server holds is
//! waited on and stopped there. Sessions' executions and runs whose stdin comes while they
//! run stay on the server their client reached.
//!
//! A claimed run starts only once [`SharedQueue::take`] confirms that the claim is still
//! this server's (fencing: see [`crate::history`]'s queue), and a drain gives back the
//! claims that have not started.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Cluster;
use crate::contract::{RunRequest, ValidRequest};
use crate::executor::{new_run_id, Executor};
use crate::history::{Claimed, SharedQueue, Submitted, Whereabouts};
use crate::report::{RunReport, Status};
use crate::runs::{
    Accepted, Confirmed, Dispatch, LookupError, Room, RunManager, Submission, SubmitError, Taken,
    WeakRunManager, ELSEWHERE_POLL, NO_LIMITS, QUEUED_STOP, UNKNOWN_GRACE, UNKNOWN_POLL,
};

/// How often an idle server looks at the shared queue when no notification came.
const QUEUE_POLL: Duration = Duration::from_secs(2);
/// How long a server that could not reach the shared queue waits before it tries again.
const QUEUE_RETRY: Duration = Duration::from_secs(1);
/// How long a stop waits for the insert of a run submitted here a moment ago.
const INSERT_WAIT: Duration = Duration::from_secs(2);
/// The key under which a claim in flight holds the room it may fill.
const CLAIM: &str = "a claim from the shared queue";

/// This server's part of the shared queue.
pub struct ClusterDispatch {
    queue: SharedQueue,
    cluster: Arc<Cluster>,
    /// Runs submitted here whose insert has not answered yet.
    pending: Arc<Mutex<HashSet<String>>>,
    /// A run this server did not hold came here (claimed), or a submission was answered.
    changed: Arc<Notify>,
}

impl ClusterDispatch {
    /// Join the shared queue: runs submitted to `runs` from now on go to `queue`, and this
    /// server claims from it. Called once, by `codebox serve` in a cluster.
    pub fn join(runs: &RunManager, queue: SharedQueue, cluster: Arc<Cluster>) {
        let me = Arc::new(ClusterDispatch {
            queue,
            cluster,
            pending: Default::default(),
            changed: Default::default(),
        });
        runs.dispatch_through(me.clone());
        runs.own(tokio::spawn(claim_loop(runs.downgrade(), me)));
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queue a run claimed from the shared queue; one that cannot run here ends
    /// `sandbox_error` saying why, one refused (shutting down) goes back.
    fn take_claimed(&self, runs: &RunManager, c: Claimed) {
        if runs.holds(&c.run_id) {
            // Claimed again after its claim was given back: the entry here starts it.
            return;
        }
        let checked = serde_json::from_str::<RunRequest>(&c.request)
            .map_err(|e| format!("its request is unreadable: {e}"))
            .and_then(|req| {
                ValidRequest::new(req, runs.registry(), runs.config()).map_err(|e| e.to_string())
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
                        runs.executor().instance()
                    ),
                );
                r.queued_ms = c.waited_ms;
                if let Some(h) = runs.history() {
                    h.finish(Arc::new(r));
                }
                self.queue.settle(&c.run_id);
                return;
            }
        };
        let taken = runs.take(Taken {
            run_id: c.run_id.clone(),
            valid,
            feed: runs.new_feed(),
            waited_ms: c.waited_ms,
            placed_elsewhere: true,
        });
        self.changed.notify_waiters();
        if taken.is_err() {
            let queue = self.queue.clone();
            tokio::spawn(async move { queue.hand_back(vec![c.run_id]).await });
        }
    }
}

impl Dispatch for ClusterDispatch {
    /// Put a run in the shared queue (its insert answers on a task): whichever server has
    /// room claims it, this one included. If the queue cannot take it (the database is
    /// down), it runs here, as without a cluster: an accepted run is never lost.
    fn place(&self, runs: &RunManager, run: Submission) -> Result<Accepted, SubmitError> {
        // A run whose stdin comes while it runs stays here, where its client is.
        if run.interactive {
            return runs.enqueue(run);
        }
        if runs.is_draining() || runs.is_closed() {
            return Err(SubmitError::ShuttingDown);
        }
        let run_id = new_run_id();
        let want = Room {
            slots: run.slots,
            memory_mb: run.charge_mb,
        };
        // Room here now: claimed in the same transaction (the room held until it is queued).
        let claim_here = runs.promise(&run_id, Some(want)).is_some();
        self.pending().insert(run_id.clone());
        let limits = run.valid.limits;
        let base = Executor::blank_report(&run_id, &run.valid);
        let submitted = Submitted {
            row: runs.history_row(&run_id, &run.valid),
            request: serde_json::to_string(&run.request).unwrap_or_default(),
            base: serde_json::to_string(&base).unwrap_or_default(),
            slots: run.slots,
            charge_mb: run.charge_mb,
            claim_here,
        };
        let (queue, pending, changed) = (
            self.queue.clone(),
            self.pending.clone(),
            self.changed.clone(),
        );
        let (manager, id) = (runs.clone(), run_id.clone());
        let (valid, feed) = (run.valid, run.feed);
        tokio::spawn(async move {
            let placed_elsewhere = match queue.submit(submitted).await {
                Ok(true) => Some(true),
                Ok(false) => None,
                Err(e) => {
                    tracing::warn!(run_id = id, error = %e, "the shared queue cannot take a run; it runs on this server");
                    Some(false)
                }
            };
            if let Some(placed_elsewhere) = placed_elsewhere {
                let taken = manager.take(Taken {
                    run_id: id.clone(),
                    valid,
                    feed,
                    waited_ms: 0,
                    placed_elsewhere,
                });
                if let Err(e) = taken {
                    tracing::error!(run_id = id, error = %e, "a run accepted for the shared queue could not be queued here");
                    if placed_elsewhere {
                        let _ = queue.hand_back(vec![id.clone()]).await;
                    }
                }
            }
            manager.unpromise(&id);
            pending
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            changed.notify_waiters();
            queue.wake();
        });
        Ok(Accepted {
            run_id,
            status: Status::Queued,
            limits,
        })
    }

    /// A run this server does not hold: one in the shared queue is waited on until a server
    /// (perhaps this one) claims it; one another server holds is waited on there, and
    /// answered as it stands when the wait ends (the caller asks again).
    fn wait<'a>(
        &'a self,
        runs: &'a RunManager,
        run_id: &'a str,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Option<RunReport>, LookupError>> {
        Box::pin(async move {
            let grace = Instant::now() + UNKNOWN_GRACE;
            // What the server holding it said last (returned if the wait ends before the run).
            let mut elsewhere: Option<RunReport> = None;
            let mut unknown_nap = UNKNOWN_POLL;
            loop {
                if runs.holds(run_id) {
                    return Ok(None);
                }
                let pending = self.arriving(run_id);
                let pause = if pending {
                    UNKNOWN_POLL
                } else {
                    let outcome = runs.stored_report(run_id).await;
                    let now = Instant::now();
                    match &outcome {
                        // In the shared queue, claimed by nobody yet.
                        Ok(r) if !r.status.is_terminal() && now < deadline => ELSEWHERE_POLL,
                        Err(LookupError::Elsewhere { .. }) if now < deadline => {
                            if let Some(r) = self
                                .cluster
                                .wait_at_owner(runs, run_id, deadline - now)
                                .await
                            {
                                if r.status.is_terminal() || Instant::now() >= deadline {
                                    return Ok(Some(r));
                                }
                                elsewhere = Some(r);
                                continue;
                            }
                            ELSEWHERE_POLL
                        }
                        Err(LookupError::Elsewhere { .. }) if elsewhere.is_some() => {
                            return Ok(elsewhere.take());
                        }
                        // Answered as it stands when the wait ends, as for one held here.
                        Err(LookupError::Elsewhere { status, owner, .. }) => {
                            let row = match runs.history() {
                                Some(h) => h.get(run_id).await.ok().flatten(),
                                None => None,
                            };
                            return Ok(Some(RunReport::new(
                                run_id,
                                row.as_ref().map(|r| r.language.clone()).unwrap_or_default(),
                                *status,
                                row.map(|r| r.limits).unwrap_or(NO_LIMITS),
                                format!("{} on another codebox server ({owner})", status.as_str()),
                            )));
                        }
                        Err(LookupError::Unknown { .. }) if now < grace.min(deadline) => {
                            // Back off (doubling): an unknown id costs a handful of lookups.
                            unknown_nap = (unknown_nap * 2).min(UNKNOWN_GRACE);
                            unknown_nap / 2
                        }
                        _ => return outcome.map(Some),
                    }
                };
                // An insert pending here answers soon (and wakes `changed`): never a zero nap
                // past the deadline, which would spin.
                let nap = if pending {
                    pause
                } else {
                    pause.min(deadline.saturating_duration_since(Instant::now()))
                };
                tokio::select! {
                    () = tokio::time::sleep(nap) => {}
                    () = self.changed.notified() => {}
                    () = self.queue.moved().notified() => {}
                }
            }
        })
    }

    /// A run this server does not hold: taken out of the shared queue while no server has
    /// claimed it, else stopped at the server that holds it.
    fn stop<'a>(
        &'a self,
        runs: &'a RunManager,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunReport>, LookupError>> {
        Box::pin(async move {
            // A run submitted here a moment ago: its insert answers first.
            let _ = tokio::time::timeout(INSERT_WAIT, self.arrived(Some(run_id))).await;
            if runs.holds(run_id) {
                return Ok(None);
            }
            match self.queue.withdraw(run_id, QUEUED_STOP).await {
                Ok(Some(r)) => {
                    runs.metrics().record(&r);
                    return Ok(Some(r));
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(run_id, error = %e, "cannot take a run out of the shared queue")
                }
            }
            if runs.holds(run_id) {
                // This server claimed it meanwhile.
                return Ok(None);
            }
            if let Some(r) = self.cluster.stop_at_owner(runs, run_id).await {
                return Ok(Some(r));
            }
            runs.stored_report(run_id).await.map(Some)
        })
    }

    /// Start a claimed run only once the database confirms that the claim is still this
    /// server's, which takes the row out of the queue and marks the run `running`. A claim
    /// given back meanwhile (this server's lease was judged lapsed) is not started here: the
    /// run is the queue's, or another server's now, and must not run twice.
    fn confirm<'a>(
        &'a self,
        run_id: &'a str,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Confirmed> {
        Box::pin(async move {
            loop {
                match self.queue.take(run_id).await {
                    Ok(true) => return Confirmed::Start,
                    Ok(false) => {
                        tracing::warn!(
                            run_id,
                            "a run claimed here was given back to the shared queue before it started (this server's lease was judged lapsed): not started here; another server runs it"
                        );
                        return Confirmed::GivenBack;
                    }
                    Err(e) if cancel.is_cancelled() => {
                        tracing::warn!(run_id, error = %e, "a claimed run was stopped while the shared queue could not confirm its claim; it did not start here");
                        return Confirmed::Stopped;
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
        })
    }

    fn unstarted(&self, run_id: &str) {
        self.queue.settle(run_id);
    }

    /// Give the runs claimed here that have not started back to the shared queue (a drain
    /// or a shutdown): another server runs them. If the database cannot be told, they go
    /// back once this server's lease lapses.
    fn closing<'a>(&'a self, runs: &'a RunManager) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            let ids = runs.give_back_unstarted();
            if ids.is_empty() {
                return;
            }
            match self.queue.hand_back(ids).await {
                Ok(n) => tracing::info!(
                    runs = n,
                    "gave the claimed runs that had not started back to the shared queue"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot give claimed runs back to the shared queue; they go back once this server's lease lapses")
                }
            }
        })
    }

    /// A run waiting in the shared queue (claimed by no server), or claimed here a moment ago
    /// (the claim committed, the run not yet queued here): its report as it stands.
    fn standing(&self, at: &Whereabouts, here: bool) -> Option<(Status, &'static str)> {
        if here && !at.status.is_terminal() {
            Some((
                at.status,
                "claimed by this server from the shared queue; starting",
            ))
        } else if at.unclaimed && at.status == Status::Queued {
            Some((
                Status::Queued,
                "waiting in the shared queue: no codebox server has room for it yet",
            ))
        } else {
            None
        }
    }

    fn arriving(&self, run_id: &str) -> bool {
        self.pending().contains(run_id)
    }

    fn arrived<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                let on_its_way = match run_id {
                    Some(id) => self.arriving(id),
                    None => !self.pending().is_empty(),
                };
                if !on_its_way {
                    return;
                }
                changed.await;
            }
        })
    }
}

/// Claim from the shared queue what fits this server, whenever work arrives, room here grows,
/// or [`QUEUE_POLL`] has passed; nothing while draining.
async fn claim_loop(runs: WeakRunManager, me: Arc<ClusterDispatch>) {
    loop {
        let Some(manager) = runs.upgrade() else {
            return;
        };
        if manager.is_closed() {
            return;
        }
        // Held until what it claims is queued here: a run submitted here while the claim is
        // on its way to the database would count on the same room, and the two together
        // overfill this server (seen as a run claimed by a server whose slots were all
        // taken, while another server had room).
        let mut pause = QUEUE_POLL;
        if let Some(free) = manager.promise(CLAIM, None) {
            let policy = &manager.config().runs;
            let room = crate::history::Room {
                slots: free.slots,
                memory_mb: free.memory_mb,
                max_slots: policy.max_concurrent_runs,
                budget_mb: policy.memory_budget_mb,
            };
            let claimed = me.queue.claim(room).await.map(|claimed| {
                let n = claimed.len();
                for c in claimed {
                    me.take_claimed(&manager, c);
                }
                n
            });
            manager.unpromise(CLAIM);
            match claimed {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "cannot claim from the shared queue; trying again");
                    pause = QUEUE_RETRY;
                }
            }
        }
        tokio::select! {
            () = me.queue.work().notified() => {}
            () = manager.freed().notified() => {}
            () = tokio::time::sleep(pause) => {}
        }
    }
}
