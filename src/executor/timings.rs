//! Where a run's time goes, step by step, for `/metrics` and `codebox bench`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// One leg of a run, timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leg {
    /// Getting a container: one ready in the pool, or a new one created.
    Acquire,
    /// Attaching to it, and starting it when it was not started ahead of time.
    Deliver,
    /// The compile stage, whole (its own acquire, deliver, run and collect).
    Compile,
    /// From the container's start to the end of its output: the payload laid out, the
    /// program run, its output relayed, its files sent back.
    Run,
    /// Waiting for the container's exit and reading its state.
    Collect,
    /// Removing a container (after the report, in the background).
    Remove,
}

impl Leg {
    pub const ALL: [Leg; 6] = [
        Leg::Acquire,
        Leg::Deliver,
        Leg::Compile,
        Leg::Run,
        Leg::Collect,
        Leg::Remove,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Leg::Acquire => "acquire",
            Leg::Deliver => "deliver",
            Leg::Compile => "compile",
            Leg::Run => "run",
            Leg::Collect => "collect",
            Leg::Remove => "remove",
        }
    }
}

/// Upper bounds (seconds) of the step histogram's buckets.
pub(crate) const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0, 30.0,
];

/// One step's histogram.
#[derive(Default)]
pub struct Histogram {
    /// Counts per bucket of [`BUCKETS`] (not cumulative).
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn record(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(
            d.as_micros().min(u64::MAX as u128) as u64,
            Ordering::Relaxed,
        );
    }

    /// (cumulative count per bucket, count, sum in seconds)
    pub(crate) fn snapshot(&self) -> ([u64; BUCKETS.len()], u64, f64) {
        let mut cumulative = [0; BUCKETS.len()];
        let mut total = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            total += b.load(Ordering::Relaxed);
            cumulative[i] = total;
        }
        (
            cumulative,
            self.count.load(Ordering::Relaxed),
            self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
        )
    }
}

/// The histograms of every step.
#[derive(Default)]
pub struct Timings {
    steps: [Histogram; Leg::ALL.len()],
}

impl Timings {
    pub fn record(&self, step: Leg, d: Duration) {
        self.steps[step as usize].record(d);
    }

    pub fn get(&self, step: Leg) -> &Histogram {
        &self.steps[step as usize]
    }
}
