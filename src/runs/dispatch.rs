//! Where a new run is queued, and who answers for a run this server does not hold: the seam
//! another part plugs into ([`RunManager::dispatch_through`]). Without one, [`Local`]: every
//! run is queued here, and a run not held here is looked up in the history.
//!
//! A dispatch that places runs elsewhere brings back those it takes with
//! [`RunManager::take`]; a run placed elsewhere starts here only once the dispatch confirms
//! it ([`Dispatch::confirm`]), and goes back with [`RunManager::give_back_unstarted`].

use std::sync::Arc;

use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::lookup::{ELSEWHERE_POLL, UNKNOWN_GRACE, UNKNOWN_POLL};
use super::{Accepted, LookupError, RunManager, SubmitError};
use crate::contract::{RunRequest, ValidRequest};
use crate::history::Whereabouts;
use crate::live::Feed;
use crate::report::{RunReport, Status};

/// A new run, validated and charged, to be queued somewhere.
pub struct Submission {
    /// The request as the client sent it.
    pub request: RunRequest,
    pub valid: ValidRequest,
    pub slots: usize,
    pub charge_mb: u64,
    pub feed: Arc<Feed>,
    /// Its stdin comes while it runs, from a client connected here: it runs here.
    pub interactive: bool,
}

/// A run accepted before it came to this manager ([`RunManager::take`]).
pub struct Taken {
    pub run_id: String,
    pub valid: ValidRequest,
    pub feed: Arc<Feed>,
    /// How long it waited before it came here.
    pub waited_ms: u64,
    /// It was placed elsewhere, which recorded it: it starts only once the dispatch
    /// confirms it ([`Dispatch::confirm`]). Otherwise it is recorded here.
    pub placed_elsewhere: bool,
}

/// Whether a run placed elsewhere may start here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Confirmed {
    /// It is this server's: it starts.
    Start,
    /// It went back (and runs elsewhere): it leaves without a report.
    GivenBack,
    /// It was stopped before it could be confirmed: it ends `stopped`, never started.
    Stopped,
}

/// Where runs go, and who answers for those not held here. Every method has the local
/// answer as its default ([`Local`]).
pub trait Dispatch: Send + Sync {
    /// Queue a new run.
    fn place(&self, runs: &RunManager, run: Submission) -> Result<Accepted, SubmitError> {
        runs.enqueue(run)
    }

    /// The report of a run this server does not hold, waiting until `deadline` for its end
    /// (then as it stands). `Ok(None)`: it came here meanwhile; look again.
    fn wait<'a>(
        &'a self,
        runs: &'a RunManager,
        run_id: &'a str,
        deadline: Instant,
    ) -> BoxFuture<'a, Result<Option<RunReport>, LookupError>> {
        Box::pin(async move { wait_stored(runs, run_id, deadline).await.map(Some) })
    }

    /// Stop a run this server does not hold; `Ok(None)` as for [`Dispatch::wait`].
    fn stop<'a>(
        &'a self,
        runs: &'a RunManager,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<RunReport>, LookupError>> {
        Box::pin(async move { runs.stored_report(run_id).await.map(Some) })
    }

    /// Whether a run placed elsewhere may start now (it was admitted here). `cancel` is
    /// cancelled when it is stopped meanwhile.
    fn confirm<'a>(
        &'a self,
        run_id: &'a str,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Confirmed> {
        let _ = (run_id, cancel);
        Box::pin(async { Confirmed::Start })
    }

    /// A run placed elsewhere ended here before it started.
    fn unstarted(&self, run_id: &str) {
        let _ = run_id;
    }

    /// A drain or a shutdown begins: give back what was placed elsewhere and has not started.
    fn closing<'a>(&'a self, runs: &'a RunManager) -> BoxFuture<'a, ()> {
        let _ = runs;
        Box::pin(async {})
    }

    /// Where a run the history says is unfinished stands, if this dispatch placed it and no
    /// server runs it yet (`here`: the history names this server): the status and message of
    /// its report as it stands. `None`: a server holds it.
    fn standing(&self, at: &Whereabouts, here: bool) -> Option<(Status, &'static str)> {
        let _ = (at, here);
        None
    }

    /// Whether run `run_id` is on its way to this manager.
    fn arriving(&self, run_id: &str) -> bool {
        let _ = run_id;
        false
    }

    /// Resolves once run `run_id` (`None`: every run) on its way to this manager has come
    /// or gone elsewhere (a drain waits for them).
    fn arrived<'a>(&'a self, run_id: Option<&'a str>) -> BoxFuture<'a, ()> {
        let _ = run_id;
        Box::pin(async {})
    }
}

/// Every run queued here; a run not held here looked up in the history.
pub struct Local;

impl Dispatch for Local {}

/// The local answer for a run this manager does not hold ([`super::Dispatch::wait`]): its
/// stored report. One another server holds unfinished is looked at again until `deadline`
/// (then answered as it stands); an id the history does not know yet, during
/// [`UNKNOWN_GRACE`] (its server may have accepted it a moment ago).
async fn wait_stored(
    runs: &RunManager,
    run_id: &str,
    deadline: Instant,
) -> Result<RunReport, LookupError> {
    let grace = Instant::now() + UNKNOWN_GRACE;
    let mut nap = UNKNOWN_POLL;
    loop {
        let outcome = runs.stored_report(run_id).await;
        let now = Instant::now();
        let pause = match &outcome {
            Ok(r) if !r.status.is_terminal() && now < deadline => ELSEWHERE_POLL,
            Err(LookupError::Elsewhere { .. }) if now < deadline => ELSEWHERE_POLL,
            Err(LookupError::Unknown { .. })
                if now < grace.min(deadline) && runs.history().is_some() =>
            {
                // Back off (doubling): an unknown id costs a handful of lookups.
                nap = (nap * 2).min(UNKNOWN_GRACE);
                nap / 2
            }
            _ => return outcome,
        };
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(now))).await;
    }
}
