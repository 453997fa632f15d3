//! The other servers of a cluster, as the run manager sees them: a run submitted here that
//! another server claimed from the shared queue is waited on and stopped there. The cluster
//! module implements it (it knows who holds what and how to reach them); the manager only
//! asks.

use std::time::Duration;

use futures_util::future::BoxFuture;

use super::RunManager;
use crate::report::RunReport;

/// Another server's answer about a run this server does not hold.
pub trait Peers: Send + Sync {
    /// Wait at most `timeout` at the server that holds `run_id` for its report (as it then
    /// stands); `None` when no other living server holds it or it does not answer.
    fn wait<'a>(
        &'a self,
        manager: &'a RunManager,
        run_id: &'a str,
        timeout: Duration,
    ) -> BoxFuture<'a, Option<RunReport>>;

    /// Stop `run_id` at the server that holds it; `None` as for [`Peers::wait`].
    fn stop<'a>(
        &'a self,
        manager: &'a RunManager,
        run_id: &'a str,
    ) -> BoxFuture<'a, Option<RunReport>>;
}
