//! Finished reports: kept for `runs.result_retention_seconds`, but memory holds at most
//! `runs.retained_reports_mb` of them (outputs plus [`REPORT_OVERHEAD_BYTES`] each). Beyond
//! that the oldest leave memory and are remembered as evicted (with their end) until their
//! retention passes, so that a lookup knows to ask the history database for them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::report::RunReport;

/// Memory charged per finished report besides its outputs: ids, message, limits, bookkeeping.
pub const REPORT_OVERHEAD_BYTES: u64 = 1024;

/// What a finished report counts against `runs.retained_reports_mb`: the bytes it holds
/// (`RunReport::held_bytes`) plus [`REPORT_OVERHEAD_BYTES`].
pub fn report_bytes(r: &RunReport) -> u64 {
    r.held_bytes() + REPORT_OVERHEAD_BYTES
}

struct Finished {
    report: Arc<RunReport>,
    ended: Instant,
    bytes: u64,
}

/// The finished runs of one manager.
#[derive(Default)]
pub(super) struct Retention {
    finished: HashMap<String, Finished>,
    /// `finished`'s ids, oldest end first (runs end in order, under the manager's lock).
    order: VecDeque<String>,
    bytes: u64,
    /// Runs whose report left memory, with their end, until their retention passes: by id,
    /// and oldest end first.
    evicted: HashMap<String, Instant>,
    evicted_order: VecDeque<String>,
}

impl Retention {
    /// Keep a report that just became final.
    pub fn keep(&mut self, run_id: &str, report: Arc<RunReport>) {
        let bytes = report_bytes(&report);
        self.bytes += bytes;
        self.order.push_back(run_id.to_string());
        self.finished.insert(
            run_id.to_string(),
            Finished {
                report,
                ended: Instant::now(),
                bytes,
            },
        );
    }

    /// The runs that ended within `within`, newest first.
    pub(crate) fn ended_within(&self, within: Duration) -> Vec<String> {
        let mut ids = Vec::new();
        for id in self.order.iter().rev() {
            match self.finished.get(id) {
                Some(f) if f.ended.elapsed() <= within => ids.push(id.clone()),
                Some(_) => break,
                None => {}
            }
        }
        ids
    }

    /// Replace a kept report by the one the history holds (the first final report written).
    pub fn replace(&mut self, run_id: &str, report: Arc<RunReport>) {
        if let Some(f) = self.finished.get_mut(run_id) {
            let bytes = report_bytes(&report);
            self.bytes = self.bytes - f.bytes + bytes;
            f.bytes = bytes;
            f.report = report;
        }
    }

    pub fn get(&self, run_id: &str) -> Option<&Arc<RunReport>> {
        self.finished.get(run_id).map(|f| &f.report)
    }

    /// Move the oldest reports out of memory until the rest take at most `max_bytes`;
    /// returns how many left.
    pub(super) fn evict_over(&mut self, max_bytes: u64) -> usize {
        let mut evicted = 0;
        while self.bytes > max_bytes {
            let Some(id) = self.order.pop_front() else {
                break;
            };
            let Some(f) = self.finished.remove(&id) else {
                continue;
            };
            self.bytes -= f.bytes;
            self.evicted.insert(id.clone(), f.ended);
            self.evicted_order.push_back(id);
            evicted += 1;
        }
        evicted
    }

    /// Forget every run that ended at least `keep` ago; returns their ids.
    pub(super) fn purge(&mut self, keep: Duration) -> Vec<String> {
        let mut gone = Vec::new();
        while let Some(id) = self.order.front() {
            if self
                .finished
                .get(id)
                .is_some_and(|f| f.ended.elapsed() < keep)
            {
                break;
            }
            let id = self.order.pop_front().expect("the front exists");
            if let Some(f) = self.finished.remove(&id) {
                self.bytes -= f.bytes;
            }
            gone.push(id);
        }
        while let Some(id) = self.evicted_order.front() {
            if self
                .evicted
                .get(id)
                .is_some_and(|ended| ended.elapsed() < keep)
            {
                break;
            }
            let id = self.evicted_order.pop_front().expect("the front exists");
            self.evicted.remove(&id);
            gone.push(id);
        }
        gone
    }

    /// For an evicted run: whether it is still within `retention` of its end. `None` when
    /// the run was never evicted here.
    pub(super) fn evicted_within(&self, run_id: &str, retention: Duration) -> Option<bool> {
        self.evicted
            .get(run_id)
            .map(|ended| ended.elapsed() < retention)
    }

    /// Reports held in memory.
    pub fn len(&self) -> usize {
        self.finished.len()
    }

    /// What they count against `runs.retained_reports_mb`.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Reports evicted from memory, within their retention.
    pub fn evicted(&self) -> usize {
        self.evicted.len()
    }
}
