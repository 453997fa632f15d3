//! The `[sessions]` settings: how many sessions may be open, how much of the memory budget
//! they may hold, how long they live, and how much one call may upload into them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

section! {
    /// Sessions (`create_session`): containers that keep files, and for stateful languages an
    /// interpreter, between executions.
    ///
    /// # Security
    /// A session's container lives up to `max_lifetime_seconds` with the posture of every
    /// run; the memory open sessions hold is taken from `runs.memory_budget_mb`, and
    /// `memory_budget_mb` caps it so that runs always keep the rest.
    pub struct SessionSettings {
        /// Sessions open at once; `create_session` beyond it is refused (retryable).
        pub max_sessions: usize = 8,
        /// Memory all open sessions may hold together, in MB (default: half of
        /// `runs.memory_budget_mb`). It is taken from the runs' budget while held.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub memory_budget_mb: Option<u64> = None,
        /// A session's working directory, in MB (memory-backed; at most half its memory).
        pub workspace_mb: u64 = 256,
        /// A session unused this long, in seconds, ends (`idle_timeout_seconds` of
        /// `create_session` may ask for less, or more up to `max_idle_timeout_seconds`).
        pub idle_timeout_seconds: u64 = 600,
        /// The longest idle timeout a client may ask for, in seconds.
        pub max_idle_timeout_seconds: u64 = 3600,
        /// A session ends this long after it was created, in seconds, whatever it does.
        pub max_lifetime_seconds: u64 = 3600,
        /// Bytes the `files` of one session call may hold in all.
        pub max_upload_bytes: usize = 16 * 1024 * 1024,
        /// Sessions opened ahead of time per language, e.g. `{ python = 1 }` (`codebox serve`
        /// only): a `create_session` with the default limits and no files takes one at once
        /// instead of starting a container and an interpreter. Each holds its memory from
        /// the sessions' share while it waits, serves one session only, and is replaced after
        /// `pool.idle_seconds`. `{}` turns it off.
        pub ready: BTreeMap<String, usize> = default_ready(),
    }
}

fn default_ready() -> BTreeMap<String, usize> {
    BTreeMap::from([("python".to_string(), 1)])
}

impl SessionSettings {
    /// The memory open sessions may hold, in MB.
    pub fn memory_budget_mb(&self, config: &Config) -> u64 {
        self.memory_budget_mb
            .unwrap_or(config.runs.memory_budget_mb / 2)
    }

    /// A session's working directory for a memory limit: the setting, at most half the memory.
    pub(crate) fn workspace_mb_for(&self, memory_mb: u64) -> u64 {
        self.workspace_mb.min(memory_mb / 2).max(1)
    }

    pub(super) fn validate(&self, config: &Config) -> Result<(), ConfigError> {
        let invalid = |setting: &str, value: String, reason: String| {
            Err(ConfigError::Invalid {
                setting: setting.to_string(),
                value,
                reason,
            })
        };
        let budget = config.runs.memory_budget_mb;
        if let Some(m) = self.memory_budget_mb {
            if m > budget / 2 {
                return invalid(
                    "sessions.memory_budget_mb",
                    m.to_string(),
                    format!("must be at most half of runs.memory_budget_mb ({} MB), so that runs keep the rest", budget / 2),
                );
            }
        }
        if self.max_sessions > 1024 {
            return invalid(
                "sessions.max_sessions",
                self.max_sessions.to_string(),
                "must be at most 1024".into(),
            );
        }
        if self.workspace_mb == 0 {
            return invalid(
                "sessions.workspace_mb",
                "0".into(),
                "must be positive".into(),
            );
        }
        for (name, v) in [
            ("sessions.idle_timeout_seconds", self.idle_timeout_seconds),
            (
                "sessions.max_idle_timeout_seconds",
                self.max_idle_timeout_seconds,
            ),
            ("sessions.max_lifetime_seconds", self.max_lifetime_seconds),
        ] {
            if v == 0 || v > 7 * 24 * 3600 {
                return invalid(
                    name,
                    v.to_string(),
                    "must be between 1 and 604800 (a week)".into(),
                );
            }
        }
        if self.idle_timeout_seconds > self.max_idle_timeout_seconds {
            return invalid(
                "sessions.idle_timeout_seconds",
                self.idle_timeout_seconds.to_string(),
                format!(
                    "must be at most sessions.max_idle_timeout_seconds ({})",
                    self.max_idle_timeout_seconds
                ),
            );
        }
        // A call's files travel in base64 (4 bytes for 3) inside a JSON body.
        let needed = self.max_upload_bytes.div_ceil(3) * 4 + 64 * 1024;
        if config.http.max_body_bytes < needed {
            return invalid(
                "http.max_body_bytes",
                config.http.max_body_bytes.to_string(),
                format!(
                    "must be at least {needed} so that a session call's files (sessions.max_upload_bytes = {}) fit in it as base64; raise it or lower sessions.max_upload_bytes",
                    self.max_upload_bytes
                ),
            );
        }
        Ok(())
    }
}
