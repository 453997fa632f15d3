//! Fencing the runs of a server that only looked dead. When this server's lease was judged
//! lapsed (it was paused or cut off for longer than the lease) and it re-joined, the others
//! had marked its runs `sandbox_error` ("its server stopped answering") and given its
//! unstarted claims back. Here the same then holds: every run the history has a final report
//! for is stopped (its containers removed) and answers with that report. What the history
//! does not say ended stays: claims are fenced when they start ([`super::dispatch::ClusterDispatch`]),
//! and runs accepted since are this server's. Sessions fence their own.

use std::time::Duration;

use tokio::sync::watch;

use crate::history::Lapse;
use crate::runs::{RunManager, WeakRunManager};

/// Stop what the others ended each time this server finds its lease was judged lapsed
/// (a server whose history has no lease never does).
pub fn watch(runs: &RunManager) {
    if let Some(history) = runs.history() {
        let lapses = history.lapses();
        runs.own(tokio::spawn(fence_loop(runs.downgrade(), lapses)));
    }
}

async fn fence_loop(runs: WeakRunManager, mut lapses: watch::Receiver<Lapse>) {
    while lapses.changed().await.is_ok() {
        let lapse = *lapses.borrow_and_update();
        let Some(runs) = runs.upgrade() else { return };
        fence(&runs, lapse).await;
    }
}

async fn fence(runs: &RunManager, lapse: Lapse) {
    let Some(history) = runs.history().cloned() else {
        return;
    };
    // Runs that ended here while the lease was not renewed: the report the others wrote
    // first is the run's (the one here was dropped by the history), here too.
    let recent = runs.ended_within(lapse.unrenewed + Duration::from_secs(1));
    let mut replaced = 0;
    for id in recent {
        if let Ok(Some(theirs)) = history.report(&id, None).await {
            if runs.overrule(theirs) {
                tracing::warn!(run_id = id, "a run that ended here while this server's lease was judged lapsed was reported by the others first: their report stands here too");
                replaced += 1;
            }
        }
    }
    let mut stopped = 0;
    for id in runs.unfinished() {
        match history.report(&id, None).await {
            Ok(Some(theirs)) => {
                if runs.overrule(theirs) {
                    stopped += 1;
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(run_id = id, error = %e, "cannot tell whether the others ended a run this server holds")
            }
        }
    }
    tracing::warn!(
        runs = stopped,
        replaced,
        "stopping the runs the other servers ended while this server's lease was judged lapsed"
    );
}
