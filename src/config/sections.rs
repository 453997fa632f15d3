//! The sections of the configuration: limits, sandbox, runs, HTTP, pool and cache (the
//! history and Docker sections have files of their own).

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::RunLimits;

section! {
    /// Defaults and ceilings of the limits a request may set (`limits` in `run_code`).
    /// A request over a ceiling is rejected, never clamped.
    pub struct LimitSettings {
        /// Memory of a run when the request sets none, in MB.
        pub default_memory_mb: u64 = 512,
        /// Most memory a request may ask for, in MB.
        pub max_memory_mb: u64 = 16384,
        /// Wall-clock limit of the run stage when the request sets none, in seconds.
        pub default_timeout_seconds: f64 = 30.0,
        /// Longest wall-clock limit a request may ask for, in seconds.
        pub max_timeout_seconds: f64 = 3600.0,
        /// CPU quota when the request sets none, in cores.
        pub default_cpus: f64 = 1.0,
        /// Largest CPU quota a request may ask for, in cores.
        pub max_cpus: f64 = 4.0,
    }
}

impl LimitSettings {
    pub fn defaults(&self) -> RunLimits {
        RunLimits {
            memory_mb: self.default_memory_mb,
            timeout_seconds: self.default_timeout_seconds,
            cpus: self.default_cpus,
        }
    }

    /// The ceilings these settings alone set; what a client can reach is
    /// [`crate::config::Config::ceilings`] (the memory budget may be lower).
    pub(super) fn settings_ceilings(&self) -> RunLimits {
        RunLimits {
            memory_mb: self.max_memory_mb,
            timeout_seconds: self.max_timeout_seconds,
            cpus: self.max_cpus,
        }
    }
}

section! {
    /// Limits no client can change.
    ///
    /// # Security
    /// Each of these bounds what one run can take from the host: raising `pids_limit` weakens
    /// the fork-bomb defence, `output_limit_bytes` and the `max_output_*` caps bound the
    /// server's memory per run, `tmpfs_mb` and `workspace_mb` are memory counted against the
    /// run's own limit, `max_file_size_mb` bounds any single file a program or compiler
    /// writes. The request caps (`max_code_bytes` to `max_arg_bytes`) bound what a client can
    /// make codebox hold and copy.
    pub struct SandboxSettings {
        /// Most processes and threads in one container.
        pub pids_limit: i64 = 256,
        /// Bytes of stdout and of stderr kept per run; the rest is counted and dropped.
        pub output_limit_bytes: u64 = 1024 * 1024,
        /// Size of the `/tmp` and `/dev/shm` tmpfs scratch spaces, in MB (never more than the
        /// run's memory limit, which they count against).
        pub tmpfs_mb: u64 = 64,
        /// Largest single file a program or compiler may write, in MB (`RLIMIT_FSIZE`).
        pub max_file_size_mb: u64 = 256,
        /// Largest `code` of a request, in bytes.
        pub max_code_bytes: usize = 512 * 1024,
        /// Largest `stdin` of a request, in bytes.
        pub max_stdin_bytes: usize = 1024 * 1024,
        /// Most `files` in a request.
        pub max_files: usize = 32,
        /// Most bytes of all `files` of a request together.
        pub max_files_bytes: usize = 4 * 1024 * 1024,
        /// Most `args` in a request.
        pub max_args: usize = 64,
        /// Longest single argument, in bytes.
        pub max_arg_bytes: usize = 4096,
        /// Size of a run's working directory, in MB: a tmpfs holding the source, the
        /// request's files and the compile stage's artifacts, where the program may create
        /// files (filling it gives `ENOSPC`). It is memory: it counts against the run's
        /// memory limit, and a run gets at most half its memory (32 MB at 64 MB).
        pub workspace_mb: u64 = 64,
        /// Most files under `outputs/` returned with their content.
        pub max_output_files: usize = 32,
        /// Most bytes of returned files together.
        pub max_output_bytes: u64 = 8 * 1024 * 1024,
        /// Largest returned file, in bytes; larger ones are listed without content.
        pub max_output_file_bytes: u64 = 4 * 1024 * 1024,
        /// The OCI runtime every container runs under: `runc`, `runsc` (gVisor: the
        /// program talks to a user-space kernel, not the host's), or any runtime registered
        /// with the daemon (`codebox doctor` lists what the daemon offers and checks the
        /// configured one).
        ///
        /// # Security
        /// With `runc` every run shares the host's kernel, so a kernel exploit escapes the
        /// container; `runsc` puts gVisor between them at some cost in speed.
        pub runtime: String = "runc".to_string(),
        /// Hosts programs may reach over HTTP(S), through codebox's egress proxy (SPEC 13):
        /// `host` (ports 443 and 80) or `host:port`, e.g. `["api.example.com"]`. Empty (the
        /// default): programs have no way out at all.
        ///
        /// # Security
        /// Every run and session then talks to these hosts as the code it runs decides: data
        /// in the run can leave to them, and what they answer comes in. Programs still have
        /// no network of their own (`network_mode=none`); the proxy refuses other hosts, IP
        /// literals and names resolving to loopback, private, link-local or metadata
        /// addresses unless an entry is one. See SECURITY.md, "Programs' own egress".
        pub egress_hosts: Vec<String> = Vec::new(),
    }
}

section! {
    /// Admission and retention of runs.
    pub struct RunsSettings {
        /// Runs executing at once.
        pub max_concurrent_runs: usize = 4,
        /// Runs waiting for a slot; beyond this a request is refused (retryable).
        pub max_queued_runs: usize = 256,
        /// Sum of the memory of admitted runs, in MB. A run is charged the larger of its own
        /// limit and its language's compile-stage limit (the stages run one after the other).
        pub memory_budget_mb: u64 = 8192,
        /// How long a finished run's report stays available to `get_result`, in seconds (at
        /// least 3600).
        pub result_retention_seconds: u64 = 3600,
        /// Total size of the finished reports kept in memory, in MB (their stdout, stderr and
        /// compile output, plus a small fixed overhead each). Beyond it the oldest reports
        /// leave memory; `get_result` then reads them from the history database, which keeps
        /// full reports for the retention period.
        ///
        /// # Security
        /// This is what bounds the server's memory for results: without it, an hour of runs
        /// that fill their output caps is tens of GiB. If the history database is
        /// unavailable, an evicted report is lost to `get_result` (the error names this
        /// setting), but memory stays bounded.
        pub retained_reports_mb: u64 = 256,
    }
}

/// How much of a run's code the history keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum CodePolicy {
    /// Only the sha256 of the code.
    None,
    /// The sha256 and the first 500 characters.
    #[default]
    Preview,
    /// The sha256 and the whole code.
    Full,
}

/// Characters of code kept by the `preview` history policy.
pub(crate) const CODE_PREVIEW_CHARS: usize = 500;

/// Host header values accepted by `/mcp` (any port) unless `http.allowed_hosts` says otherwise.
const DEFAULT_ALLOWED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

section! {
    /// The Streamable HTTP transport.
    ///
    /// # Security
    /// Anyone who can reach the listen address and holds the token can run code on this
    /// host's Docker. Keep the default loopback address unless the port is protected;
    /// `allowed_hosts` is the DNS-rebinding defence (a browser page cannot make requests with
    /// a foreign Host), so list only the names clients really use.
    pub struct HttpSettings {
        /// Address `codebox serve --transport http` listens on (port 0 picks a free one).
        pub listen: String = "127.0.0.1:8765".to_string(),
        /// Host header values accepted at `/mcp` (`name` matches any port, `name:port` exactly).
        pub allowed_hosts: Vec<String> = DEFAULT_ALLOWED_HOSTS.iter().map(|h| h.to_string()).collect(),
        /// Largest request body, in bytes (larger: 413).
        pub max_body_bytes: usize = 32 * 1024 * 1024,
        /// File holding the bearer token (`--token-file` and then `CODEBOX_TOKEN` take
        /// precedence). The token itself is never a setting.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub token_file: Option<PathBuf> = None,
        /// Serve the console (a web page for people) at `/` (`--no-console` turns it off).
        pub console: bool = true,
    }
}

fn default_pool_sizes() -> BTreeMap<String, usize> {
    [("bash", 1), ("cpp", 1), ("javascript", 1), ("python", 2)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

section! {
    /// Containers created and started before their run arrives (`codebox serve` only). Each
    /// serves exactly one run, passes the posture check, and is removed after it: a run that
    /// takes one skips creating and starting its own.
    pub struct PoolSettings {
        /// How many ready containers to keep per language (its run stage, and for compiled
        /// languages its compile stage too), e.g. `{ python = 2, cpp = 1 }`. Their memory
        /// limits count against `runs.memory_budget_mb` while they wait, and they are given
        /// back when a queued run needs the memory. `{}` turns the pool off.
        pub sizes: BTreeMap<String, usize> = default_pool_sizes(),
        /// Most ready containers per language and shape when recent demand asks for more than
        /// `sizes` (the pool keeps as many as the most runs of that kind that were in flight
        /// at once, queued or running, in the last minute), e.g. `{ python = 16, cpp = 2 }`.
        /// A language left out has `default_max_ready`; one set to its `sizes` (or 0) does
        /// not follow demand. Growth also needs room in `runs.memory_budget_mb` and nobody
        /// waiting for a slot.
        pub max_ready: BTreeMap<String, usize> = BTreeMap::new(),
        /// `max_ready` of the languages `max_ready` does not name.
        pub default_max_ready: usize = 8,
        /// A container that waited this long, in seconds, is replaced by a fresh one.
        pub idle_seconds: u64 = 300,
    }
}

section! {
    /// The compile cache: artifacts (or the compile error) of code compiled before, kept in
    /// codebox's memory, where no run can change them.
    pub struct CacheSettings {
        /// Most memory the cached artifacts and compiler output may take, in MB; the least
        /// recently used go first. 0 turns the cache off.
        pub compile_mb: u64 = 128,
    }
}
