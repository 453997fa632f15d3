//! What runs asked of one shape of container lately: the most in flight at once within
//! [`DEMAND_WINDOW`], and the arrival rate, from which the pool sizes itself.

use std::time::Duration;

use tokio::time::Instant;

/// How far back demand is remembered.
pub const DEMAND_WINDOW: Duration = Duration::from_secs(60);
/// Runs of a shape within [`DEMAND_WINDOW`] before the pool keeps containers of a shape
/// `pool.sizes` does not name.
pub const CLASS_MIN_RUNS: usize = 2;
/// Runs that arrive faster than containers are made need more ready than are in flight at
/// once: the arrivals of this last stretch give the rate.
const RATE_WINDOW: Duration = Duration::from_secs(2);

/// What runs asked of one shape lately.
#[derive(Debug, Default)]
pub(super) struct Demand {
    /// Containers of this shape runs in flight use or will use.
    pub(super) in_flight: usize,
    /// (when, in flight from then on) for each change within the window.
    pub(super) changes: Vec<(Instant, usize)>,
    /// In flight when the window began.
    pub(super) before: usize,
    /// When runs asked for it within the window.
    pub(super) arrivals: Vec<Instant>,
    /// (when, how many) containers more than in flight the arrival rate asked for: as many
    /// as arrive while one is made.
    pub(super) extras: Vec<(Instant, usize)>,
    /// The most the languages that asked may keep ready.
    pub(super) ceiling: usize,
}

impl Demand {
    /// Forget what is older than the window.
    pub(super) fn prune(&mut self, now: Instant) {
        let start = now.checked_sub(DEMAND_WINDOW).unwrap_or(now);
        let old = self.changes.iter().take_while(|(t, _)| *t < start).count();
        if old > 0 {
            self.before = self.changes[old - 1].1;
            self.changes.drain(..old);
        }
        // All three are in time order (written under the pool's lock): drop a prefix.
        let old = self.arrivals.partition_point(|t| *t < start);
        self.arrivals.drain(..old);
        let old = self.extras.partition_point(|(t, _)| *t < start);
        self.extras.drain(..old);
    }

    /// Note the arrival rate of the last [`RATE_WINDOW`] as containers made meanwhile.
    pub(super) fn arrived(&mut self, now: Instant, fill: Duration) {
        let since = now.checked_sub(RATE_WINDOW).unwrap_or(now);
        let recent = self.arrivals.len() - self.arrivals.partition_point(|t| *t < since);
        let extra = (recent as f64 * fill.as_secs_f64() / RATE_WINDOW.as_secs_f64()) as usize;
        if extra > 0 {
            self.extras.push((now, extra));
        }
    }

    pub(super) fn change(&mut self, now: Instant, in_flight: usize) {
        self.in_flight = in_flight;
        self.changes.push((now, in_flight));
        self.prune(now);
    }

    /// The most in flight at once within the window.
    pub(super) fn peak(&self) -> usize {
        self.changes
            .iter()
            .map(|(_, n)| *n)
            .fold(self.before.max(self.in_flight), usize::max)
    }

    /// The most the arrival rate asked for beyond what was in flight, within the window.
    pub(super) fn extra(&self) -> usize {
        self.extras.iter().map(|(_, n)| *n).max().unwrap_or(0)
    }

    pub(super) fn is_forgotten(&self) -> bool {
        self.in_flight == 0
            && self.changes.is_empty()
            && self.arrivals.is_empty()
            && self.extras.is_empty()
    }
}
