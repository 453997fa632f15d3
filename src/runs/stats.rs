//! Counts for tests, `/metrics` and the logs.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::executor::Executor;

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
    /// Their size as counted against `runs.retained_reports_mb` ([`super::retention::report_bytes`]).
    pub retained_report_bytes: u64,
    /// Finished runs within the retention whose reports were evicted from memory.
    pub evicted: usize,
    /// Containers ready in the pool, and the pool's counters.
    pub pool: PoolSnapshot,
    /// Compile-cache lookups that found a verdict, and those that did not.
    pub compile_cache_hits: u64,
    pub compile_cache_misses: u64,
    /// Packages on request: cache hits, misses (installs), failed installs, bytes installed
    /// and downloaded, and what the cache holds now (bytes, prefixes).
    pub packages: PackagesSnapshot,
    /// What holds memory beside runs: counted by its holder, and added by whoever shows the
    /// whole (the run manager's own [`super::RunManager::stats`] leaves it empty).
    pub sessions: SessionCounts,
}

/// Sessions open, those opened ahead of time (`sessions.ready`), and the memory all of them
/// hold.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionCounts {
    pub open: usize,
    pub ready: usize,
    pub memory_mb: u64,
}

/// What the packages cache and install step have done.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PackagesSnapshot {
    pub hits: u64,
    pub misses: u64,
    pub failures: u64,
    pub installed_bytes: u64,
    pub downloaded_bytes: u64,
    pub cached_bytes: u64,
    pub cached_prefixes: usize,
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
    /// Removed because demand fell below what the pool held.
    pub trimmed: u64,
}

/// What the executor's pool, compile cache and packages hold and have done; the run
/// manager's own counts left at zero.
pub(super) fn of_executor(executor: &Executor) -> Stats {
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
    let pool = executor.pool();
    let c = pool.counters();
    let pool = PoolSnapshot {
        stats: pool.stats(),
        hits: load(&c.hits),
        updated_hits: load(&c.updated_hits),
        misses: load(&c.misses),
        created: load(&c.created),
        failed: load(&c.failed),
        expired: load(&c.expired),
        trimmed: load(&c.trimmed),
    };
    let (compile_cache_hits, compile_cache_misses) = executor.cache_counts();
    let p = executor.packages();
    let c = p.counters();
    let (cached_bytes, cached_prefixes) = p.cached();
    let packages = PackagesSnapshot {
        hits: load(&c.hits),
        misses: load(&c.misses),
        failures: load(&c.failures),
        installed_bytes: load(&c.installed_bytes),
        downloaded_bytes: load(&c.downloaded_bytes),
        cached_bytes,
        cached_prefixes,
    };
    Stats {
        pool,
        compile_cache_hits,
        compile_cache_misses,
        packages,
        ..Stats::default()
    }
}
