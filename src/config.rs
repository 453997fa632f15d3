//! Operator settings: the `DEFAULT_*` constants, and the limits every request is checked against.
//!
//! Configuration is injected: nothing here reads global state except [`Config::load`], which
//! reads an optional TOML file and is called once at start.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::report::RunLimits;

pub const DEFAULT_MEMORY_MB: u64 = 512;
pub const MAX_MEMORY_MB: u64 = 16384;
pub const DEFAULT_TIMEOUT_SECONDS: f64 = 30.0;
pub const MAX_TIMEOUT_SECONDS: f64 = 3600.0;
pub const DEFAULT_CPUS: f64 = 1.0;
pub const MAX_CPUS: f64 = 4.0;

pub const DEFAULT_PIDS_LIMIT: i64 = 256;
pub const DEFAULT_OUTPUT_LIMIT_BYTES: u64 = 1024 * 1024;
pub const DEFAULT_TMPFS_MB: u64 = 64;
pub const DEFAULT_MAX_FILE_SIZE_MB: u64 = 256;
pub const DEFAULT_COMPILE_TIMEOUT_SECONDS: f64 = 60.0;
pub const DEFAULT_COMPILE_MEMORY_MB: u64 = 1024;
pub const DEFAULT_COMPILE_CPUS: f64 = 1.0;

pub const DEFAULT_MAX_CODE_BYTES: usize = 512 * 1024;
pub const DEFAULT_MAX_STDIN_BYTES: usize = 1024 * 1024;
pub const DEFAULT_MAX_FILES: usize = 32;
pub const DEFAULT_MAX_FILES_BYTES: usize = 4 * 1024 * 1024;
pub const DEFAULT_MAX_ARGS: usize = 64;
pub const DEFAULT_MAX_ARG_BYTES: usize = 4096;

/// At most this many runs execute at once (`[runs] max_concurrent_runs`).
pub const DEFAULT_MAX_CONCURRENT_RUNS: usize = 4;
/// At most this many runs wait for a slot; one more is refused as retryable (`[runs] max_queued_runs`).
pub const DEFAULT_MAX_QUEUED_RUNS: usize = 256;
/// The memory of all running runs together stays within this (`[runs] memory_budget_mb`).
pub const DEFAULT_MEMORY_BUDGET_MB: u64 = 8192;
/// Reports stay available to `get_result` this long after a run ends (`[runs] result_retention_seconds`).
pub const DEFAULT_RESULT_RETENTION_SECONDS: u64 = 3600;
/// The contract's floor for the retention: reports are kept at least an hour.
pub const MIN_RESULT_RETENTION_SECONDS: u64 = 3600;
/// Finished reports held in memory together stay within this many MB (`[runs] retained_reports_mb`);
/// beyond it the oldest are evicted and served from the history database.
pub const DEFAULT_RETAINED_REPORTS_MB: u64 = 256;
/// File name of the history database inside the data directory.
pub const DEFAULT_HISTORY_FILE: &str = "history.sqlite3";
/// Characters of code kept by the `preview` history policy.
pub const CODE_PREVIEW_CHARS: usize = 500;
/// Address `codebox serve --transport http` listens on.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8765";
/// Largest HTTP request body accepted at `/mcp` (larger: 413).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;
/// Host header values accepted by `/mcp` (any port) unless the operator sets `[http] allowed_hosts`.
pub const DEFAULT_ALLOWED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The first of the sandbox users images create (`sandbox`, then `sandbox2` ...).
pub const SANDBOX_UID_FIRST: u32 = 10001;
/// How many sandbox users images create: each concurrent run gets its own.
pub const SANDBOX_UIDS: u32 = 64;

/// Defaults and ceilings for the client-settable limits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitPolicy {
    pub defaults: RunLimits,
    pub ceilings: RunLimits,
}

impl Default for LimitPolicy {
    fn default() -> Self {
        LimitPolicy {
            defaults: RunLimits {
                memory_mb: DEFAULT_MEMORY_MB,
                timeout_seconds: DEFAULT_TIMEOUT_SECONDS,
                cpus: DEFAULT_CPUS,
            },
            ceilings: RunLimits {
                memory_mb: MAX_MEMORY_MB,
                timeout_seconds: MAX_TIMEOUT_SECONDS,
                cpus: MAX_CPUS,
            },
        }
    }
}

/// Limits no client can change.
///
/// # Security
/// Each of these bounds what one run can take from the host: raising `pids_limit` weakens the
/// fork-bomb defence, `output_limit_bytes` bounds the server's memory per run, `tmpfs_mb` counts
/// against the run's memory, `max_file_size_mb` bounds any single file a program or compiler
/// writes (the compile workspace is a Docker volume with no size limit of its own).
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxPolicy {
    pub pids_limit: i64,
    pub output_limit_bytes: u64,
    pub tmpfs_mb: u64,
    pub max_file_size_mb: u64,
    pub max_code_bytes: usize,
    pub max_stdin_bytes: usize,
    pub max_files: usize,
    pub max_files_bytes: usize,
    pub max_args: usize,
    pub max_arg_bytes: usize,
}

impl Default for SandboxPolicy {
    fn default() -> Self {
        SandboxPolicy {
            pids_limit: DEFAULT_PIDS_LIMIT,
            output_limit_bytes: DEFAULT_OUTPUT_LIMIT_BYTES,
            tmpfs_mb: DEFAULT_TMPFS_MB,
            max_file_size_mb: DEFAULT_MAX_FILE_SIZE_MB,
            max_code_bytes: DEFAULT_MAX_CODE_BYTES,
            max_stdin_bytes: DEFAULT_MAX_STDIN_BYTES,
            max_files: DEFAULT_MAX_FILES,
            max_files_bytes: DEFAULT_MAX_FILES_BYTES,
            max_args: DEFAULT_MAX_ARGS,
            max_arg_bytes: DEFAULT_MAX_ARG_BYTES,
        }
    }
}

/// Admission and retention of runs in `codebox serve`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunsPolicy {
    /// Runs executing at once.
    pub max_concurrent_runs: usize,
    /// Runs waiting for a slot; beyond this a request is refused (retryable).
    pub max_queued_runs: usize,
    /// Sum of the memory of admitted runs, in MB. A run is charged the larger of its own limit
    /// and its language's compile-stage limit (the stages run one after the other).
    pub memory_budget_mb: u64,
    /// How long a finished run's report stays available to `get_result`, in seconds.
    pub result_retention_seconds: u64,
    /// Total size of the finished reports kept in memory, in MB (their stdout, stderr and
    /// compile output, plus a small fixed overhead each). Beyond it the oldest reports leave
    /// memory; `get_result` then reads them from the history database, which keeps full
    /// reports for the retention period.
    ///
    /// # Security
    /// This is what bounds the server's memory for results: without it, an hour of runs that
    /// fill their output caps is tens of GiB. If the history database is unavailable, an
    /// evicted report is lost to `get_result` (the error names this setting), but memory stays
    /// bounded.
    pub retained_reports_mb: u64,
}

impl Default for RunsPolicy {
    fn default() -> Self {
        RunsPolicy {
            max_concurrent_runs: DEFAULT_MAX_CONCURRENT_RUNS,
            max_queued_runs: DEFAULT_MAX_QUEUED_RUNS,
            memory_budget_mb: DEFAULT_MEMORY_BUDGET_MB,
            result_retention_seconds: DEFAULT_RESULT_RETENTION_SECONDS,
            retained_reports_mb: DEFAULT_RETAINED_REPORTS_MB,
        }
    }
}

/// How much of a run's code the history keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, Deserialize)]
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

impl CodePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            CodePolicy::None => "none",
            CodePolicy::Preview => "preview",
            CodePolicy::Full => "full",
        }
    }

    pub fn parse(s: &str) -> Option<CodePolicy> {
        [CodePolicy::None, CodePolicy::Preview, CodePolicy::Full]
            .into_iter()
            .find(|p| p.as_str() == s)
    }
}

/// The run history database.
#[derive(Debug, Clone, PartialEq)]
pub struct HistoryPolicy {
    /// SQLite file; `None`: `<data_dir>/history.sqlite3`.
    pub path: Option<PathBuf>,
    /// How much code is stored with each run.
    pub code: CodePolicy,
}

impl Default for HistoryPolicy {
    fn default() -> Self {
        HistoryPolicy {
            path: None,
            code: CodePolicy::Preview,
        }
    }
}

/// The Streamable HTTP transport.
///
/// # Security
/// Anyone who can reach the listen address and holds the token can run code on this host's
/// Docker. Keep the default loopback address unless the port is protected; `allowed_hosts`
/// is the DNS-rebinding defence (a browser page cannot make requests with a foreign Host),
/// so list only the names clients really use.
#[derive(Debug, Clone, PartialEq)]
pub struct HttpPolicy {
    pub listen: String,
    /// Host header values accepted at `/mcp` (`name` matches any port, `name:port` exactly).
    pub allowed_hosts: Vec<String>,
    /// Largest request body, in bytes.
    pub max_body_bytes: usize,
    /// File holding the bearer token (the `CODEBOX_TOKEN` variable takes precedence).
    pub token_file: Option<PathBuf>,
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            listen: DEFAULT_LISTEN.to_string(),
            allowed_hosts: DEFAULT_ALLOWED_HOSTS
                .iter()
                .map(|h| h.to_string())
                .collect(),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            token_file: None,
        }
    }
}

/// Everything the executor needs to know from the operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub limits: LimitPolicy,
    pub sandbox: SandboxPolicy,
    /// Path of `languages.toml`.
    pub languages_path: Option<PathBuf>,
    /// Where codebox keeps its state (history, instance locks).
    pub data_dir: PathBuf,
    /// Admission and retention in `codebox serve`.
    pub runs: RunsPolicy,
    pub history: HistoryPolicy,
    pub http: HttpPolicy,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: LimitPolicy::default(),
            sandbox: SandboxPolicy::default(),
            languages_path: None,
            data_dir: default_data_dir(),
            runs: RunsPolicy::default(),
            history: HistoryPolicy::default(),
            http: HttpPolicy::default(),
        }
    }
}

/// `$CODEBOX_DATA_DIR`, else the user's data directory (e.g. `~/.local/share/codebox`).
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("CODEBOX_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    directories::ProjectDirs::from("", "", "codebox")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".codebox"))
}

/// A configuration problem, naming the setting and the value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("setting `{setting}` = {value} is invalid: {reason}")]
    Invalid {
        setting: &'static str,
        value: String,
        reason: String,
    },
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    languages: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    sandbox: RawSandbox,
    #[serde(default)]
    runs: RawRuns,
    #[serde(default)]
    history: RawHistory,
    #[serde(default)]
    http: RawHttp,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawRuns {
    max_concurrent_runs: Option<usize>,
    max_queued_runs: Option<usize>,
    memory_budget_mb: Option<u64>,
    result_retention_seconds: Option<u64>,
    retained_reports_mb: Option<u64>,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawHistory {
    path: Option<PathBuf>,
    code: Option<CodePolicy>,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    listen: Option<String>,
    allowed_hosts: Option<Vec<String>>,
    max_body_bytes: Option<usize>,
    token_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    default_memory_mb: Option<u64>,
    max_memory_mb: Option<u64>,
    default_timeout_seconds: Option<f64>,
    max_timeout_seconds: Option<f64>,
    default_cpus: Option<f64>,
    max_cpus: Option<f64>,
}

#[derive(Debug, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct RawSandbox {
    pids_limit: Option<i64>,
    output_limit_bytes: Option<u64>,
    tmpfs_mb: Option<u64>,
    max_file_size_mb: Option<u64>,
    max_code_bytes: Option<usize>,
    max_stdin_bytes: Option<usize>,
    max_files: Option<usize>,
    max_files_bytes: Option<usize>,
}

impl Config {
    /// Read a TOML config file (all settings optional) and validate it.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml(&text).map_err(|e| match e {
            ConfigError::Parse { message, .. } => ConfigError::Parse {
                path: path.to_path_buf(),
                message,
            },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: PathBuf::new(),
            message: e.message().to_string(),
        })?;
        let mut c = Config::default();
        let l = &mut c.limits;
        let r = raw.limits;
        l.defaults.memory_mb = r.default_memory_mb.unwrap_or(l.defaults.memory_mb);
        l.ceilings.memory_mb = r.max_memory_mb.unwrap_or(l.ceilings.memory_mb);
        l.defaults.timeout_seconds = r
            .default_timeout_seconds
            .unwrap_or(l.defaults.timeout_seconds);
        l.ceilings.timeout_seconds = r.max_timeout_seconds.unwrap_or(l.ceilings.timeout_seconds);
        l.defaults.cpus = r.default_cpus.unwrap_or(l.defaults.cpus);
        l.ceilings.cpus = r.max_cpus.unwrap_or(l.ceilings.cpus);
        let s = &mut c.sandbox;
        let r = raw.sandbox;
        s.pids_limit = r.pids_limit.unwrap_or(s.pids_limit);
        s.output_limit_bytes = r.output_limit_bytes.unwrap_or(s.output_limit_bytes);
        s.tmpfs_mb = r.tmpfs_mb.unwrap_or(s.tmpfs_mb);
        s.max_file_size_mb = r.max_file_size_mb.unwrap_or(s.max_file_size_mb);
        s.max_code_bytes = r.max_code_bytes.unwrap_or(s.max_code_bytes);
        s.max_stdin_bytes = r.max_stdin_bytes.unwrap_or(s.max_stdin_bytes);
        s.max_files = r.max_files.unwrap_or(s.max_files);
        s.max_files_bytes = r.max_files_bytes.unwrap_or(s.max_files_bytes);
        c.languages_path = raw.languages;
        if let Some(d) = raw.data_dir {
            c.data_dir = d;
        }
        let (p, r) = (&mut c.runs, raw.runs);
        p.max_concurrent_runs = r.max_concurrent_runs.unwrap_or(p.max_concurrent_runs);
        p.max_queued_runs = r.max_queued_runs.unwrap_or(p.max_queued_runs);
        p.memory_budget_mb = r.memory_budget_mb.unwrap_or(p.memory_budget_mb);
        p.result_retention_seconds = r
            .result_retention_seconds
            .unwrap_or(p.result_retention_seconds);
        p.retained_reports_mb = r.retained_reports_mb.unwrap_or(p.retained_reports_mb);
        if raw.history.path.is_some() {
            c.history.path = raw.history.path;
        }
        c.history.code = raw.history.code.unwrap_or(c.history.code);
        let (h, r) = (&mut c.http, raw.http);
        h.listen = r.listen.unwrap_or(std::mem::take(&mut h.listen));
        h.allowed_hosts = r
            .allowed_hosts
            .unwrap_or(std::mem::take(&mut h.allowed_hosts));
        h.max_body_bytes = r.max_body_bytes.unwrap_or(h.max_body_bytes);
        if r.token_file.is_some() {
            h.token_file = r.token_file;
        }
        c.validate()?;
        Ok(c)
    }

    /// The history database file.
    pub fn history_path(&self) -> PathBuf {
        self.history
            .path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(DEFAULT_HISTORY_FILE))
    }

    /// Apply `CODEBOX_*` environment variables (see [`ENV_SETTINGS`]) on top of the file's
    /// settings, then validate. `get` reads one variable (injected so tests need no real env).
    pub fn apply_env(&mut self, get: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        for (var, setting) in ENV_SETTINGS {
            if let Some(value) = get(var).filter(|v| !v.is_empty()) {
                self.set(setting, &value)
                    .map_err(|reason| ConfigError::Invalid {
                        setting,
                        value: format!("{value:?} (from {var})"),
                        reason,
                    })?;
            }
        }
        self.validate()
    }

    /// Set one setting from text, by its config-file name (`runs.max_concurrent_runs`).
    pub fn set(&mut self, setting: &str, value: &str) -> Result<(), String> {
        fn num<T: std::str::FromStr>(v: &str) -> Result<T, String> {
            v.trim()
                .parse()
                .map_err(|_| "is not a valid number".to_string())
        }
        match setting {
            "data_dir" => self.data_dir = PathBuf::from(value),
            "languages" => self.languages_path = Some(PathBuf::from(value)),
            "limits.default_memory_mb" => self.limits.defaults.memory_mb = num(value)?,
            "limits.max_memory_mb" => self.limits.ceilings.memory_mb = num(value)?,
            "limits.default_timeout_seconds" => self.limits.defaults.timeout_seconds = num(value)?,
            "limits.max_timeout_seconds" => self.limits.ceilings.timeout_seconds = num(value)?,
            "limits.default_cpus" => self.limits.defaults.cpus = num(value)?,
            "limits.max_cpus" => self.limits.ceilings.cpus = num(value)?,
            "runs.max_concurrent_runs" => self.runs.max_concurrent_runs = num(value)?,
            "runs.max_queued_runs" => self.runs.max_queued_runs = num(value)?,
            "runs.memory_budget_mb" => self.runs.memory_budget_mb = num(value)?,
            "runs.result_retention_seconds" => self.runs.result_retention_seconds = num(value)?,
            "runs.retained_reports_mb" => self.runs.retained_reports_mb = num(value)?,
            "history.path" => self.history.path = Some(PathBuf::from(value)),
            "history.code" => {
                self.history.code = CodePolicy::parse(value.trim())
                    .ok_or_else(|| "must be one of none, preview, full".to_string())?
            }
            "http.listen" => self.http.listen = value.trim().to_string(),
            "http.allowed_hosts" => {
                self.http.allowed_hosts = value
                    .split(',')
                    .map(|h| h.trim().to_string())
                    .filter(|h| !h.is_empty())
                    .collect()
            }
            "http.max_body_bytes" => self.http.max_body_bytes = num(value)?,
            "http.token_file" => self.http.token_file = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown setting `{setting}`")),
        }
        Ok(())
    }

    /// The effective settings as a config file (what `codebox serve --print-config` prints).
    /// The token itself is never part of the config.
    pub fn to_toml(&self) -> String {
        let (d, c, s) = (self.limits.defaults, self.limits.ceilings, &self.sandbox);
        let raw = RawConfig {
            languages: self.languages_path.clone(),
            data_dir: Some(self.data_dir.clone()),
            limits: RawLimits {
                default_memory_mb: Some(d.memory_mb),
                max_memory_mb: Some(c.memory_mb),
                default_timeout_seconds: Some(d.timeout_seconds),
                max_timeout_seconds: Some(c.timeout_seconds),
                default_cpus: Some(d.cpus),
                max_cpus: Some(c.cpus),
            },
            sandbox: RawSandbox {
                pids_limit: Some(s.pids_limit),
                output_limit_bytes: Some(s.output_limit_bytes),
                tmpfs_mb: Some(s.tmpfs_mb),
                max_file_size_mb: Some(s.max_file_size_mb),
                max_code_bytes: Some(s.max_code_bytes),
                max_stdin_bytes: Some(s.max_stdin_bytes),
                max_files: Some(s.max_files),
                max_files_bytes: Some(s.max_files_bytes),
            },
            runs: RawRuns {
                max_concurrent_runs: Some(self.runs.max_concurrent_runs),
                max_queued_runs: Some(self.runs.max_queued_runs),
                memory_budget_mb: Some(self.runs.memory_budget_mb),
                result_retention_seconds: Some(self.runs.result_retention_seconds),
                retained_reports_mb: Some(self.runs.retained_reports_mb),
            },
            history: RawHistory {
                path: Some(self.history_path()),
                code: Some(self.history.code),
            },
            http: RawHttp {
                listen: Some(self.http.listen.clone()),
                allowed_hosts: Some(self.http.allowed_hosts.clone()),
                max_body_bytes: Some(self.http.max_body_bytes),
                token_file: self.http.token_file.clone(),
            },
        };
        toml::to_string(&raw).unwrap_or_else(|e| format!("# cannot print the config: {e}\n"))
    }

    /// Check every setting once, at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(setting: &'static str, value: impl ToString, reason: &str) -> ConfigError {
            ConfigError::Invalid {
                setting,
                value: value.to_string(),
                reason: reason.to_string(),
            }
        }
        let (d, c) = (self.limits.defaults, self.limits.ceilings);
        if c.memory_mb == 0 || c.memory_mb > MAX_MEMORY_MB * 64 {
            return Err(invalid(
                "limits.max_memory_mb",
                c.memory_mb,
                "must be positive",
            ));
        }
        if d.memory_mb == 0 || d.memory_mb > c.memory_mb {
            return Err(invalid(
                "limits.default_memory_mb",
                d.memory_mb,
                &format!(
                    "must be between 1 and limits.max_memory_mb ({})",
                    c.memory_mb
                ),
            ));
        }
        for (name, v) in [
            ("limits.max_timeout_seconds", c.timeout_seconds),
            ("limits.max_cpus", c.cpus),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(name, v, "must be a positive number"));
            }
        }
        if !(d.timeout_seconds.is_finite()
            && d.timeout_seconds > 0.0
            && d.timeout_seconds <= c.timeout_seconds)
        {
            return Err(invalid(
                "limits.default_timeout_seconds",
                d.timeout_seconds,
                &format!(
                    "must be positive and at most limits.max_timeout_seconds ({})",
                    c.timeout_seconds
                ),
            ));
        }
        if !(d.cpus.is_finite() && d.cpus > 0.0 && d.cpus <= c.cpus) {
            return Err(invalid(
                "limits.default_cpus",
                d.cpus,
                &format!("must be positive and at most limits.max_cpus ({})", c.cpus),
            ));
        }
        let s = &self.sandbox;
        if s.pids_limit < 8 {
            return Err(invalid(
                "sandbox.pids_limit",
                s.pids_limit,
                "must be at least 8",
            ));
        }
        if s.output_limit_bytes == 0 {
            return Err(invalid("sandbox.output_limit_bytes", 0, "must be positive"));
        }
        if s.tmpfs_mb == 0 {
            return Err(invalid("sandbox.tmpfs_mb", 0, "must be positive"));
        }
        if s.max_file_size_mb == 0 {
            return Err(invalid("sandbox.max_file_size_mb", 0, "must be positive"));
        }
        let r = &self.runs;
        if r.max_concurrent_runs == 0 || r.max_concurrent_runs > 1024 {
            return Err(invalid(
                "runs.max_concurrent_runs",
                r.max_concurrent_runs,
                "must be between 1 and 1024",
            ));
        }
        if r.max_queued_runs > 100_000 {
            return Err(invalid(
                "runs.max_queued_runs",
                r.max_queued_runs,
                "must be at most 100000",
            ));
        }
        if r.memory_budget_mb < 6 {
            return Err(invalid(
                "runs.memory_budget_mb",
                r.memory_budget_mb,
                "must be at least 6 MB",
            ));
        }
        if r.memory_budget_mb < d.memory_mb {
            return Err(invalid(
                "runs.memory_budget_mb",
                r.memory_budget_mb,
                &format!(
                    "must be at least limits.default_memory_mb ({})",
                    d.memory_mb
                ),
            ));
        }
        if r.result_retention_seconds < MIN_RESULT_RETENTION_SECONDS {
            return Err(invalid(
                "runs.result_retention_seconds",
                r.result_retention_seconds,
                &format!("must be at least {MIN_RESULT_RETENTION_SECONDS} (reports are kept for at least an hour)"),
            ));
        }
        if r.retained_reports_mb == 0 {
            return Err(invalid(
                "runs.retained_reports_mb",
                0,
                "must be positive (it bounds the memory of finished reports)",
            ));
        }
        let h = &self.http;
        if h.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(invalid(
                "http.listen",
                format!("{:?}", h.listen),
                "must be an IP address and port, e.g. 127.0.0.1:8765",
            ));
        }
        if h.allowed_hosts.is_empty() {
            return Err(invalid(
                "http.allowed_hosts",
                "[]",
                "must list at least one host name; the Host check is the defence against DNS rebinding",
            ));
        }
        if h.max_body_bytes < 1024 {
            return Err(invalid(
                "http.max_body_bytes",
                h.max_body_bytes,
                "must be at least 1024",
            ));
        }
        Ok(())
    }
}

/// Environment variables that override config-file settings: (variable, setting).
/// `CODEBOX_DATA_DIR` is also read for the default data directory.
pub const ENV_SETTINGS: [(&str, &str); 15] = [
    ("CODEBOX_DATA_DIR", "data_dir"),
    ("CODEBOX_DEFAULT_MEMORY_MB", "limits.default_memory_mb"),
    ("CODEBOX_MAX_MEMORY_MB", "limits.max_memory_mb"),
    (
        "CODEBOX_DEFAULT_TIMEOUT_SECONDS",
        "limits.default_timeout_seconds",
    ),
    ("CODEBOX_MAX_TIMEOUT_SECONDS", "limits.max_timeout_seconds"),
    ("CODEBOX_MAX_CONCURRENT_RUNS", "runs.max_concurrent_runs"),
    ("CODEBOX_MAX_QUEUED_RUNS", "runs.max_queued_runs"),
    ("CODEBOX_MEMORY_BUDGET_MB", "runs.memory_budget_mb"),
    (
        "CODEBOX_RESULT_RETENTION_SECONDS",
        "runs.result_retention_seconds",
    ),
    ("CODEBOX_RETAINED_REPORTS_MB", "runs.retained_reports_mb"),
    ("CODEBOX_HISTORY_PATH", "history.path"),
    ("CODEBOX_HISTORY_CODE", "history.code"),
    ("CODEBOX_LISTEN", "http.listen"),
    ("CODEBOX_ALLOWED_HOSTS", "http.allowed_hosts"),
    ("CODEBOX_MAX_BODY_BYTES", "http.max_body_bytes"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_defaults_match_the_contract() {
        let c = Config::default();
        assert_eq!(c.limits.defaults.memory_mb, 512);
        assert_eq!(c.limits.ceilings.memory_mb, 16384);
        assert_eq!(c.limits.defaults.timeout_seconds, 30.0);
        assert_eq!(c.limits.ceilings.timeout_seconds, 3600.0);
        assert_eq!(c.limits.defaults.cpus, 1.0);
        assert_eq!(c.limits.ceilings.cpus, 4.0);
        assert_eq!(c.sandbox.pids_limit, 256);
        assert_eq!(c.sandbox.output_limit_bytes, 1 << 20);
        c.validate().unwrap();
    }

    #[test]
    fn config_file_errors_name_the_setting_and_value() {
        let err = Config::from_toml("[limits]\ndefault_memory_mb = 99999\n").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("limits.default_memory_mb"), "{msg}");
        assert!(msg.contains("99999"), "{msg}");
        let err = Config::from_toml("[limits]\nbogus = 1\n").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn serve_settings_have_documented_defaults_and_env_overrides() {
        let mut c = Config::default();
        assert_eq!(c.runs.max_concurrent_runs, 4);
        assert_eq!(c.runs.result_retention_seconds, 3600);
        assert_eq!(c.history.code, CodePolicy::Preview);
        let env = |k: &str| match k {
            "CODEBOX_MAX_CONCURRENT_RUNS" => Some("2".to_string()),
            "CODEBOX_HISTORY_CODE" => Some("full".to_string()),
            _ => None,
        };
        c.apply_env(env).unwrap();
        assert_eq!(c.runs.max_concurrent_runs, 2);
        assert_eq!(c.history.code, CodePolicy::Full);
        let err = c
            .apply_env(|k| (k == "CODEBOX_MAX_CONCURRENT_RUNS").then(|| "lots".to_string()))
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("runs.max_concurrent_runs")
                && msg.contains("lots")
                && msg.contains("CODEBOX_MAX_CONCURRENT_RUNS"),
            "{msg}"
        );
    }

    #[test]
    fn printed_config_reads_back_as_the_same_config() {
        let mut c = Config::from_toml("[runs]\nmax_concurrent_runs = 3\n[history]\ncode = \"none\"\n[http]\nlisten = \"0.0.0.0:9000\"\n").unwrap();
        c.history.path = Some(c.history_path());
        let again = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        let err = Config::from_toml("[runs]\nresult_retention_seconds = 5\n").unwrap_err();
        assert!(
            err.to_string().contains("runs.result_retention_seconds"),
            "{err}"
        );
    }

    #[test]
    fn retained_reports_mb_defaults_to_256_prints_and_must_be_positive() {
        let c = Config::default();
        assert_eq!(c.runs.retained_reports_mb, 256);
        assert!(
            c.to_toml().contains("retained_reports_mb = 256"),
            "{}",
            c.to_toml()
        );
        let c = Config::from_toml("[runs]\nretained_reports_mb = 64\n").unwrap();
        assert_eq!(c.runs.retained_reports_mb, 64);
        let err = Config::from_toml("[runs]\nretained_reports_mb = 0\n").unwrap_err();
        assert!(
            err.to_string().contains("runs.retained_reports_mb"),
            "{err}"
        );
        let mut c = Config::default();
        c.apply_env(|k| (k == "CODEBOX_RETAINED_REPORTS_MB").then(|| "32".to_string()))
            .unwrap();
        assert_eq!(c.runs.retained_reports_mb, 32);
    }
}
