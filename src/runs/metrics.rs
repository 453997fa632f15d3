//! Counters for `GET /metrics`, rendered in the Prometheus text format (no client library:
//! a handful of counters and one histogram).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::executor::timings::{Leg, Timings, BUCKETS};
use crate::report::RunReport;

use super::stats::Stats;

/// Upper bounds (seconds) of the run latency histogram buckets.
const LATENCY_BUCKETS: [f64; 11] = [
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

#[derive(Default)]
struct Histogram {
    /// Cumulative counts per bucket of [`LATENCY_BUCKETS`].
    buckets: [u64; LATENCY_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Process-wide counters of the run manager.
#[derive(Default)]
pub struct Metrics {
    /// Finished runs by (status, language).
    finished: Mutex<BTreeMap<(String, String), u64>>,
    latency: Mutex<Histogram>,
    rejected_queue_full: AtomicU64,
    containers_reaped: AtomicU64,
    reports_evicted: AtomicU64,
    sessions_opened: AtomicU64,
    sessions_ended: AtomicU64,
    session_executions: AtomicU64,
    /// Interpreter resets by reason.
    session_resets: Mutex<BTreeMap<&'static str, u64>>,
    /// Readers of live events connected now (SSE streams, Piston WebSockets).
    live_readers: AtomicU64,
}

/// One connected reader of live events, counted while it lives.
pub struct LiveReader(std::sync::Arc<Metrics>);

impl Drop for LiveReader {
    fn drop(&mut self) {
        self.0.live_readers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Metrics {
    /// Count a finished run (one withdrawn where it was placed, too).
    pub fn record(&self, report: &RunReport) {
        let key = (report.status.as_str().to_string(), report.language.clone());
        *self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(key)
            .or_default() += 1;
        let seconds = (report.queued_ms + report.duration_ms) as f64 / 1000.0;
        let mut h = self.latency.lock().unwrap_or_else(|p| p.into_inner());
        for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                h.buckets[i] += 1;
            }
        }
        h.count += 1;
        h.sum += seconds;
        if let Some(s) = &report.session {
            self.session_executions.fetch_add(1, Ordering::Relaxed);
            if let Some(reason) = s.reset_reason {
                *self
                    .session_resets
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(reason.as_str())
                    .or_default() += 1;
            }
        }
    }

    /// Count a reader of live events until the returned guard is dropped.
    pub(crate) fn live_reader(self: &std::sync::Arc<Metrics>) -> LiveReader {
        self.live_readers.fetch_add(1, Ordering::Relaxed);
        LiveReader(self.clone())
    }

    pub(crate) fn session_opened(&self) {
        self.sessions_opened.fetch_add(1, Ordering::Relaxed);
    }

    pub fn session_ended(&self) {
        self.sessions_ended.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn report_evicted(&self) {
        self.reports_evicted.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn rejected_queue_full(&self) {
        self.rejected_queue_full.fetch_add(1, Ordering::Relaxed);
    }

    /// Count containers the reaper removed (left by crashed instances).
    pub(crate) fn add_reaped(&self, containers: usize) {
        self.containers_reaped
            .fetch_add(containers as u64, Ordering::Relaxed);
    }

    /// Finished runs with this status, all languages.
    pub fn finished_with(&self, status: &str) -> u64 {
        self.finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|((s, _), _)| s == status)
            .map(|(_, n)| n)
            .sum()
    }

    /// The Prometheus text exposition.
    pub fn render(&self, stats: &Stats, timings: &Timings) -> String {
        let mut out = String::new();
        let w = &mut out;
        let _ = writeln!(
            w,
            "# HELP codebox_runs_total Runs that reached a final status, by status and language."
        );
        let _ = writeln!(w, "# TYPE codebox_runs_total counter");
        for ((status, language), n) in self
            .finished
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(
                w,
                "codebox_runs_total{{status=\"{status}\",language=\"{}\"}} {n}",
                escape(language)
            );
        }
        let _ = writeln!(
            w,
            "# HELP codebox_runs_rejected_total Runs refused because the queue was full."
        );
        let _ = writeln!(w, "# TYPE codebox_runs_rejected_total counter");
        let _ = writeln!(
            w,
            "codebox_runs_rejected_total{{reason=\"queue_full\"}} {}",
            self.rejected_queue_full.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            w,
            "# HELP codebox_live_readers Readers of live events connected now (SSE streams and WebSockets)."
        );
        let _ = writeln!(w, "# TYPE codebox_live_readers gauge");
        let _ = writeln!(
            w,
            "codebox_live_readers {}",
            self.live_readers.load(Ordering::Relaxed)
        );
        let _ = writeln!(w, "# HELP codebox_queue_depth Runs waiting for a slot.");
        let _ = writeln!(w, "# TYPE codebox_queue_depth gauge");
        let _ = writeln!(w, "codebox_queue_depth {}", stats.queued);
        let _ = writeln!(w, "# HELP codebox_active_runs Runs executing now.");
        let _ = writeln!(w, "# TYPE codebox_active_runs gauge");
        let _ = writeln!(w, "codebox_active_runs {}", stats.active);
        let _ = writeln!(
            w,
            "# HELP codebox_active_runs_peak The most runs that executed at once since start."
        );
        let _ = writeln!(w, "# TYPE codebox_active_runs_peak gauge");
        let _ = writeln!(w, "codebox_active_runs_peak {}", stats.peak_active);
        let _ = writeln!(
            w,
            "# HELP codebox_active_memory_mb Memory charged to executing runs, in MB."
        );
        let _ = writeln!(w, "# TYPE codebox_active_memory_mb gauge");
        let _ = writeln!(w, "codebox_active_memory_mb {}", stats.active_memory_mb);
        let _ = writeln!(
            w,
            "# HELP codebox_retained_reports_bytes Finished reports held in memory, as counted against runs.retained_reports_mb."
        );
        let _ = writeln!(w, "# TYPE codebox_retained_reports_bytes gauge");
        let _ = writeln!(
            w,
            "codebox_retained_reports_bytes {}",
            stats.retained_report_bytes
        );
        let _ = writeln!(
            w,
            "# HELP codebox_reports_evicted_total Finished reports moved out of memory because of runs.retained_reports_mb."
        );
        let _ = writeln!(w, "# TYPE codebox_reports_evicted_total counter");
        let _ = writeln!(
            w,
            "codebox_reports_evicted_total {}",
            self.reports_evicted.load(Ordering::Relaxed)
        );
        let _ = writeln!(w, "# HELP codebox_run_latency_seconds Time from acceptance to the final status (queue wait included).");
        let _ = writeln!(w, "# TYPE codebox_run_latency_seconds histogram");
        {
            let h = self.latency.lock().unwrap_or_else(|p| p.into_inner());
            for (i, bound) in LATENCY_BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    w,
                    "codebox_run_latency_seconds_bucket{{le=\"{bound}\"}} {}",
                    h.buckets[i]
                );
            }
            let _ = writeln!(
                w,
                "codebox_run_latency_seconds_bucket{{le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(w, "codebox_run_latency_seconds_sum {}", h.sum);
            let _ = writeln!(w, "codebox_run_latency_seconds_count {}", h.count);
        }
        let _ = writeln!(w, "# HELP codebox_sessions_open Sessions open now.");
        let _ = writeln!(w, "# TYPE codebox_sessions_open gauge");
        let _ = writeln!(w, "codebox_sessions_open {}", stats.sessions.open);
        let _ = writeln!(
            w,
            "# HELP codebox_sessions_ready Sessions opened ahead of time (sessions.ready), waiting for a create_session; they give way to sessions and runs that need their memory."
        );
        let _ = writeln!(w, "# TYPE codebox_sessions_ready gauge");
        let _ = writeln!(w, "codebox_sessions_ready {}", stats.sessions.ready);
        let _ = writeln!(
            w,
            "# HELP codebox_sessions_memory_mb Memory sessions (open, and opened ahead of time) hold of runs.memory_budget_mb."
        );
        let _ = writeln!(w, "# TYPE codebox_sessions_memory_mb gauge");
        let _ = writeln!(w, "codebox_sessions_memory_mb {}", stats.sessions.memory_mb);
        for (name, help, n) in [
            (
                "codebox_sessions_opened_total",
                "Sessions opened.",
                &self.sessions_opened,
            ),
            (
                "codebox_sessions_ended_total",
                "Sessions ended (closed, expired, or their container failed).",
                &self.sessions_ended,
            ),
            (
                "codebox_session_executions_total",
                "Executions in sessions that reached a final status.",
                &self.session_executions,
            ),
        ] {
            let _ = writeln!(w, "# HELP {name} {help}");
            let _ = writeln!(w, "# TYPE {name} counter");
            let _ = writeln!(w, "{name} {}", n.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            w,
            "# HELP codebox_session_resets_total Session interpreters lost and started again, by reason."
        );
        let _ = writeln!(w, "# TYPE codebox_session_resets_total counter");
        for (reason, n) in self
            .session_resets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = writeln!(w, "codebox_session_resets_total{{reason=\"{reason}\"}} {n}");
        }
        let _ = writeln!(
            w,
            "# HELP codebox_compile_cache_lookups_total Compile-cache lookups: hit (the same inputs compiled before: no compile container), miss."
        );
        let _ = writeln!(w, "# TYPE codebox_compile_cache_lookups_total counter");
        for (result, n) in [
            ("hit", stats.compile_cache_hits),
            ("miss", stats.compile_cache_misses),
        ] {
            let _ = writeln!(
                w,
                "codebox_compile_cache_lookups_total{{result=\"{result}\"}} {n}"
            );
        }
        let k = &stats.packages;
        let _ = writeln!(
            w,
            "# HELP codebox_packages_lookups_total Packages-cache lookups: hit (the prefix was installed before: no install, no network), miss (installed now)."
        );
        let _ = writeln!(w, "# TYPE codebox_packages_lookups_total counter");
        for (result, n) in [("hit", k.hits), ("miss", k.misses)] {
            let _ = writeln!(
                w,
                "codebox_packages_lookups_total{{result=\"{result}\"}} {n}"
            );
        }
        for (name, help, kind, n) in [
            (
                "codebox_packages_install_failures_total",
                "Installs that failed, timed out or ran out of memory.",
                "counter",
                k.failures,
            ),
            (
                "codebox_packages_installed_bytes_total",
                "Bytes of package prefixes installed.",
                "counter",
                k.installed_bytes,
            ),
            (
                "codebox_packages_downloaded_bytes_total",
                "Bytes install steps downloaded through the egress proxy.",
                "counter",
                k.downloaded_bytes,
            ),
            (
                "codebox_packages_cache_bytes",
                "Bytes of installed prefixes the cache holds (packages.cache_mb caps it).",
                "gauge",
                k.cached_bytes,
            ),
            (
                "codebox_packages_cache_prefixes",
                "Installed prefixes the cache holds.",
                "gauge",
                k.cached_prefixes as u64,
            ),
        ] {
            let _ = writeln!(w, "# HELP {name} {help}");
            let _ = writeln!(w, "# TYPE {name} {kind}");
            let _ = writeln!(w, "{name} {n}");
        }
        let p = &stats.pool;
        let _ = writeln!(
            w,
            "# HELP codebox_pool_idle Containers started ahead of time, waiting for a run, by image."
        );
        let _ = writeln!(w, "# TYPE codebox_pool_idle gauge");
        for (image, n) in &p.stats.idle {
            let _ = writeln!(w, "codebox_pool_idle{{image=\"{}\"}} {n}", escape(image));
        }
        let _ = writeln!(
            w,
            "# HELP codebox_pool_memory_mb Memory limit of pooled containers (idle or starting), counted against runs.memory_budget_mb."
        );
        let _ = writeln!(w, "# TYPE codebox_pool_memory_mb gauge");
        let _ = writeln!(w, "codebox_pool_memory_mb {}", p.stats.memory_mb);
        let _ = writeln!(
            w,
            "# HELP codebox_pool_takes_total Containers a stage asked the pool for: hit (ready, same shape), updated (ready, limits changed), miss (created for it)."
        );
        let _ = writeln!(w, "# TYPE codebox_pool_takes_total counter");
        for (result, n) in [
            ("hit", p.hits),
            ("updated", p.updated_hits),
            ("miss", p.misses),
        ] {
            let _ = writeln!(w, "codebox_pool_takes_total{{result=\"{result}\"}} {n}");
        }
        let _ = writeln!(
            w,
            "# HELP codebox_pool_containers_total Pooled containers started, failed to start, replaced after waiting too long, or removed when demand fell."
        );
        let _ = writeln!(w, "# TYPE codebox_pool_containers_total counter");
        for (event, n) in [
            ("created", p.created),
            ("failed", p.failed),
            ("expired", p.expired),
            ("trimmed", p.trimmed),
        ] {
            let _ = writeln!(w, "codebox_pool_containers_total{{event=\"{event}\"}} {n}");
        }
        let _ = writeln!(
            w,
            "# HELP codebox_phase_seconds Time of each step of a run: acquire (a pooled or new container), deliver (attach, start), compile (the whole compile stage), run (program and output), collect (exit and state), remove (after the report)."
        );
        let _ = writeln!(w, "# TYPE codebox_phase_seconds histogram");
        for phase in Leg::ALL {
            let (buckets, count, sum) = timings.get(phase).snapshot();
            let p = phase.as_str();
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    w,
                    "codebox_phase_seconds_bucket{{phase=\"{p}\",le=\"{bound}\"}} {}",
                    buckets[i]
                );
            }
            let _ = writeln!(
                w,
                "codebox_phase_seconds_bucket{{phase=\"{p}\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(w, "codebox_phase_seconds_sum{{phase=\"{p}\"}} {sum}");
            let _ = writeln!(w, "codebox_phase_seconds_count{{phase=\"{p}\"}} {count}");
        }
        let _ = writeln!(w, "# HELP codebox_containers_reaped_total Containers left by crashed instances that this server removed.");
        let _ = writeln!(w, "# TYPE codebox_containers_reaped_total counter");
        let _ = writeln!(
            w,
            "codebox_containers_reaped_total {}",
            self.containers_reaped.load(Ordering::Relaxed)
        );
        out
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
