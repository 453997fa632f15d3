//! What Judge0 submissions asked for, kept in memory beside their runs.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most bytes of submissions (source, stdin, expected output) kept in memory; the oldest
/// go first.
pub const MAX_STORED_BYTES: usize = 64 * 1024 * 1024;

/// What a submission asked for, kept beside its run.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub language_id: u32,
    pub source_code: String,
    pub stdin: Option<String>,
    pub expected_output: Option<String>,
    pub cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub wall_time_limit: f64,
    pub memory_limit: i64,
    pub stack_limit: i64,
    pub max_processes_and_or_threads: i64,
    pub max_file_size: i64,
    pub command_line_arguments: Option<String>,
    pub redirect_stderr_to_stdout: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl Submission {
    fn bytes(&self) -> usize {
        self.source_code.len()
            + self.stdin.as_ref().map_or(0, String::len)
            + self.expected_output.as_ref().map_or(0, String::len)
            + self.command_line_arguments.as_ref().map_or(0, String::len)
            + 256
    }
}

#[derive(Default)]
struct Stored {
    by_run: HashMap<String, Arc<Submission>>,
    /// Run ids oldest first, with when they were stored.
    order: VecDeque<(Instant, String)>,
    bytes: usize,
}

/// The submissions of this server, by run id: kept as long as reports are
/// (`runs.result_retention_seconds`) and within [`MAX_STORED_BYTES`].
pub struct Store {
    retention: Duration,
    stored: Mutex<Stored>,
}

impl Store {
    pub fn new(retention: Duration) -> Store {
        Store {
            retention,
            stored: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, run_id: &str, submission: Submission) {
        let mut s = self.lock();
        s.bytes += submission.bytes();
        s.by_run.insert(run_id.to_string(), Arc::new(submission));
        s.order.push_back((Instant::now(), run_id.to_string()));
        while let Some((at, id)) = s.order.front().cloned() {
            if at.elapsed() < self.retention && s.bytes <= MAX_STORED_BYTES {
                break;
            }
            s.order.pop_front();
            if let Some(old) = s.by_run.remove(&id) {
                s.bytes -= old.bytes();
            }
        }
    }

    pub fn get(&self, run_id: &str) -> Option<Arc<Submission>> {
        self.lock().by_run.get(run_id).cloned()
    }
}
