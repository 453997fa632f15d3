//! Counts for tests, `/metrics` and the logs.

use std::sync::atomic::{AtomicU64, Ordering};

use super::RunManager;

/// What the run manager, the pool and the compile cache hold and have done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stats {
    pub queued: usize,
    pub active: usize,
    pub active_memory_mb: u64,
    /// The most runs that were ever executing at once.
    pub peak_active: usize,
    /// Finished runs whose reports are still kept in memory.
    pub retained: usize,
    /// Their size as counted against `runs.retained_reports_mb` ([`super::report_bytes`]).
    pub retained_report_bytes: u64,
    /// Finished runs within the retention whose reports were evicted from memory.
    pub evicted: usize,
    /// Containers ready in the pool, and the pool's counters.
    pub pool: PoolSnapshot,
    /// Compile-cache lookups that found a verdict, and those that did not.
    pub compile_cache_hits: u64,
    pub compile_cache_misses: u64,
    /// Sessions open, and the memory they hold.
    pub sessions_open: usize,
    pub sessions_memory_mb: u64,
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

impl RunManager {
    pub fn stats(&self) -> Stats {
        let executor = self.executor();
        let pool = executor.pool();
        let c = pool.counters();
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let pool = PoolSnapshot {
            stats: pool.stats(),
            hits: load(&c.hits),
            updated_hits: load(&c.updated_hits),
            misses: load(&c.misses),
            created: load(&c.created),
            failed: load(&c.failed),
            expired: load(&c.expired),
        };
        let (compile_cache_hits, compile_cache_misses) = executor.cache_counts();
        let st = self.lock();
        Stats {
            pool,
            queued: st.admission.queued(),
            active: st.admission.active(),
            active_memory_mb: st.admission.active_memory_mb(),
            peak_active: st.admission.peak_active(),
            retained: st.retention.len(),
            retained_report_bytes: st.retention.bytes(),
            evicted: st.retention.evicted(),
            compile_cache_hits,
            compile_cache_misses,
            sessions_open: st.sessions.open.len(),
            sessions_memory_mb: st.admission.held_mb(),
        }
    }
}
