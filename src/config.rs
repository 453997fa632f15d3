//! Operator settings: one struct per section, each field written once with its default and
//! its documentation (the [`section!`] macro), and checked once in [`Config::validate`].
//!
//! Configuration is resolved once per process by [`Config::resolve`], in one order: the
//! config file, then `CODEBOX_*` environment variables, then `--set SETTING=VALUE` flags. The
//! result is validated and never changed afterwards. Every setting has three spellings,
//! derived by rule from its place in these structs rather than written out:
//!
//! - in the file: `[runs]` then `max_concurrent_runs = 2`;
//! - as a flag: `--set runs.max_concurrent_runs=2`;
//! - as a variable: `CODEBOX_RUNS_MAX_CONCURRENT_RUNS=2`, or `CODEBOX_MAX_CONCURRENT_RUNS=2`
//!   when the key has several words and names one setting only (the section-qualified form
//!   wins when both are set); `CODEBOX_LISTEN` is also kept for `http.listen`.
//!
//! Lists accept `a,b,c` from a variable or a flag; tables accept TOML inline tables
//! (`{ python = 2 }`). [`Config::settings`] lists them all with their documentation
//! (`codebox config --list`), and printing a configuration (`codebox config`) then reading it
//! back gives the same configuration.

mod postgres_tls;
pub use postgres_tls::{split_tls, SslMode, TlsParams};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::RunLimits;

/// Declares a settings section: the struct, its serde shape (every field optional in the
/// file, unknown fields rejected) and its defaults, with each field written exactly once.
macro_rules! section {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$fmeta:meta])* pub $field:ident : $ty:ty = $default:expr, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(default, deny_unknown_fields)]
        pub struct $name {
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl Default for $name {
            fn default() -> Self {
                $name { $( $field: $default, )* }
            }
        }
    };
}

mod sessions;
pub use sessions::SessionSettings;

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

    pub fn ceilings(&self) -> RunLimits {
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
        /// memory limit, and is at most half of it.
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
pub const CODE_PREVIEW_CHARS: usize = 500;

section! {
    /// The run history database: an SQLite file (the default, embedded), or a PostgreSQL
    /// database that several codebox servers share.
    ///
    /// # Security
    /// The history holds every run's code (as `code` says) and, for the retention period, its
    /// output. A PostgreSQL password is never part of `url` (the configuration is printed by
    /// `codebox config` and named in log lines): put it in `password_file`. codebox speaks to
    /// PostgreSQL without TLS, so reach it over a Unix socket, loopback or a private network.
    pub struct HistorySettings {
        /// The SQLite file; when unset, `history.sqlite3` in the data directory. Unused when
        /// `url` is set.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub path: Option<PathBuf> = None,
        /// A PostgreSQL database instead of the SQLite file, e.g.
        /// `postgres://codebox@db.internal/codebox`, or over a Unix socket
        /// `postgres://codebox@%2Frun%2Fpostgresql/codebox`. Every server given the same URL
        /// records into it and reads all runs from it. No password here: see `password_file`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub url: Option<String> = None,
        /// File holding the PostgreSQL password (its first line), when the server asks for one.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub password_file: Option<PathBuf> = None,
        /// How much code is stored with each run: `none`, `preview` (500 characters) or `full`.
        pub code: CodePolicy = CodePolicy::Preview,
    }
}

/// Where the run history lives, as resolved from the `[history]` settings.
#[derive(Debug, Clone, PartialEq)]
pub enum HistoryStore {
    /// An SQLite file (created with its folder when missing).
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres {
        /// `history.url` (validated: it parses, and holds no password).
        url: String,
        /// `history.password_file`.
        password_file: Option<PathBuf>,
    },
}

impl std::fmt::Display for HistoryStore {
    /// How logs and messages name the store: the file, or the URL (which holds no password).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HistoryStore::Sqlite(path) => write!(f, "{}", path.display()),
            HistoryStore::Postgres { url, .. } => f.write_str(url),
        }
    }
}

/// `url` with the password of its user part (`user:password@`), if any, shown as `***`.
pub fn redact_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

/// Check a `history.url`: a `postgres://` or `postgresql://` URL that the PostgreSQL client
/// parses (with libpq's `sslmode` and `sslrootcert`, whose CA file must exist when a mode
/// checks the server), holding no password.
pub fn check_postgres_url(url: &str) -> Result<postgres::Config, String> {
    if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
        return Err(
            "must be a PostgreSQL URL starting with postgres:// or postgresql://, e.g. postgres://codebox@db.internal/codebox".into(),
        );
    }
    let (rest, tls) = split_tls(url)?;
    let config: postgres::Config = rest
        .parse()
        .map_err(|e| format!("is not a PostgreSQL URL the client understands: {e}"))?;
    if config.get_password().is_some() {
        return Err("must not hold a password (the configuration is printed and logged); put it in history.password_file".into());
    }
    tls.check()?;
    if config.get_hosts().is_empty() {
        return Err(
            "names no host (give one after the @, or a socket folder such as %2Frun%2Fpostgresql)"
                .into(),
        );
    }
    Ok(config)
}

/// Host header values accepted by `/mcp` (any port) unless `http.allowed_hosts` says otherwise.
pub const DEFAULT_ALLOWED_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

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

/// The docker CLI's own variables, which apply to a `docker` setting left unset by the file,
/// the `CODEBOX_*` variables and the flags: (setting, variable).
pub const DOCKER_ENV: [(&str, &str); 3] = [
    ("docker.host", "DOCKER_HOST"),
    ("docker.tls_verify", "DOCKER_TLS_VERIFY"),
    ("docker.cert_path", "DOCKER_CERT_PATH"),
];

/// The daemon's address when neither `docker.host` nor `DOCKER_HOST` says otherwise.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///var/run/docker.sock";

section! {
    /// The Docker daemon every command talks to: the local socket, or another machine over
    /// TLS. Everything reaches the daemon through the Engine API (code, files and outputs on
    /// the containers' attached streams, image build contexts as uploads), so the daemon
    /// needs no access to codebox's files. Each setting the file, the `CODEBOX_*` variables
    /// and the flags leave unset takes the docker CLI's variable: `DOCKER_HOST`,
    /// `DOCKER_TLS_VERIFY` (any non-empty value turns it on, as for the docker CLI) and
    /// `DOCKER_CERT_PATH`.
    ///
    /// # Security
    /// Whoever talks to the daemon controls the machine it runs on. Reach a daemon on another
    /// machine only with `tls_verify` on: codebox then trusts no certificate authority but
    /// `ca.pem` (as the docker CLI does) and presents `cert.pem` and `key.pem`, so the daemon
    /// (started with `--tlsverify`) knows it is codebox. A `tcp://` address without TLS is
    /// plain HTTP: anyone on the path can read the code and take over the daemon.
    pub struct DockerSettings {
        /// The daemon's address: `unix:///path/to/docker.sock` or `tcp://HOST:PORT` (2376
        /// is the usual TLS port). When unset: `DOCKER_HOST`, else
        /// `unix:///var/run/docker.sock`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub host: Option<String> = None,
        /// Talk TLS to a `tcp://` daemon and verify its certificate against `ca.pem` in
        /// `cert_path`, presenting `cert.pem` and `key.pem` from there as the client
        /// certificate. When unset: on if `DOCKER_TLS_VERIFY` is set. Ignored for a
        /// `unix://` socket.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub tls_verify: Option<bool> = None,
        /// The folder holding `ca.pem`, `cert.pem` and `key.pem`. When unset:
        /// `DOCKER_CERT_PATH`, else `~/.docker`.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub cert_path: Option<PathBuf> = None,
        /// The network of the `RUN` steps of `codebox images build` (the daemon's default
        /// bridge when unset). `host` lets a daemon started without a bridge
        /// (`--bridge=none`) reach the Debian mirror while building.
        ///
        /// # Security
        /// Only codebox's own Dockerfiles run with it, never a program: sandbox containers
        /// always have `network_mode=none`, and the posture check refuses anything else.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub build_network: Option<String> = None,
    }
}

impl DockerSettings {
    /// The daemon's address.
    pub fn address(&self) -> &str {
        self.host.as_deref().unwrap_or(DEFAULT_DOCKER_HOST)
    }

    /// Whether the daemon is reached over TLS (a `tcp://` address with `tls_verify` on).
    pub fn uses_tls(&self) -> bool {
        self.tls_verify == Some(true) && self.address().starts_with("tcp://")
    }

    /// The folder of `ca.pem`, `cert.pem` and `key.pem`: `cert_path`, else `~/.docker`.
    pub fn cert_dir(&self) -> PathBuf {
        self.cert_path.clone().unwrap_or_else(|| {
            directories::BaseDirs::new()
                .map(|d| d.home_dir().join(".docker"))
                .unwrap_or_else(|| PathBuf::from(".docker"))
        })
    }

    /// These settings, each unset one taken from the docker CLI's variable (`env` is
    /// injected so tests need no real environment).
    pub fn or_docker_env(mut self, env: impl Fn(&str) -> Option<String>) -> DockerSettings {
        let var = |name: &str| env(name).filter(|v| !v.is_empty());
        if self.host.is_none() {
            self.host = var("DOCKER_HOST");
        }
        if self.tls_verify.is_none() {
            self.tls_verify = var("DOCKER_TLS_VERIFY").map(|_| true);
        }
        if self.cert_path.is_none() {
            self.cert_path = var("DOCKER_CERT_PATH").map(PathBuf::from);
        }
        self
    }

    /// The variables that give the docker CLI the same daemon (for `codebox bench`'s
    /// baseline, which runs `docker run`).
    pub fn cli_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![("DOCKER_HOST", self.address().to_string())];
        if self.uses_tls() {
            env.push(("DOCKER_TLS_VERIFY", "1".to_string()));
            env.push(("DOCKER_CERT_PATH", self.cert_dir().display().to_string()));
        }
        env
    }
}

section! {
    /// Everything codebox needs to know from its operator.
    pub struct Config {
        /// The language registry file; when unset, `languages.toml` in the current folder,
        /// else the one beside the sources codebox was built from.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub languages: Option<PathBuf> = None,
        /// Where codebox keeps its state: the history database and instance locks.
        pub data_dir: PathBuf = default_data_dir(),
        pub limits: LimitSettings = LimitSettings::default(),
        pub sandbox: SandboxSettings = SandboxSettings::default(),
        pub runs: RunsSettings = RunsSettings::default(),
        pub history: HistorySettings = HistorySettings::default(),
        pub http: HttpSettings = HttpSettings::default(),
        pub pool: PoolSettings = PoolSettings::default(),
        pub cache: CacheSettings = CacheSettings::default(),
        pub docker: DockerSettings = DockerSettings::default(),
        pub sessions: SessionSettings = SessionSettings::default(),
    }
}

/// The user's data directory (e.g. `~/.local/share/codebox`).
fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "codebox")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".codebox"))
}

/// File name of the history database inside the data directory.
pub const DEFAULT_HISTORY_FILE: &str = "history.sqlite3";
/// The contract's floor for the retention: reports are kept at least an hour.
pub const MIN_RESULT_RETENTION_SECONDS: u64 = 3600;
/// Prefix of every configuration variable.
pub const ENV_PREFIX: &str = "CODEBOX_";
/// Short variables of one-word keys, kept from before the names were derived.
const SHORT_ALIASES: [(&str, &str); 1] = [("CODEBOX_LISTEN", "http.listen")];
/// Variables that begin with [`ENV_PREFIX`] but are not settings (and no setting may take
/// their name): the config file, the bearer token (a secret, never a setting) and the log filter.
pub const RESERVED_ENV: [&str; 3] = ["CODEBOX_CONFIG", "CODEBOX_TOKEN", "CODEBOX_LOG"];

/// Where a setting's value came from, for error messages.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    File(PathBuf),
    Env(String),
    Flag,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::File(p) => write!(f, "in {}", p.display()),
            Source::Env(v) => write!(f, "from {v}"),
            Source::Flag => f.write_str("from --set"),
        }
    }
}

/// A configuration problem, naming the setting, the value and where it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("--set {item}: expected SETTING=VALUE, e.g. --set runs.max_concurrent_runs=2")]
    SetSyntax { item: String },
    #[error("unknown setting `{setting}` ({origin}); `codebox config --list` lists them all")]
    Unknown { setting: String, origin: Source },
    #[error("setting `{setting}` = {value} ({origin}) is not a valid {expected}")]
    Type {
        setting: String,
        value: String,
        expected: &'static str,
        origin: Source,
    },
    #[error("setting `{setting}` = {value} is invalid: {reason}")]
    Invalid {
        setting: String,
        value: String,
        reason: String,
    },
}

/// The kind of value a setting holds, from its schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Integer,
    Number,
    Boolean,
    Text,
    List,
    Table,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Integer => "whole number",
            Kind::Number => "number",
            Kind::Boolean => "boolean (true or false)",
            Kind::Text => "text",
            Kind::List => "list (a,b,c)",
            Kind::Table => "table ({ key = value })",
        }
    }
}

/// One setting: its dotted path, what it holds, its documentation and its variables.
#[derive(Debug, Clone, PartialEq)]
pub struct Setting {
    /// `runs.max_concurrent_runs`: the file key and the `--set` path.
    pub path: String,
    pub kind: Kind,
    pub doc: String,
    /// `CODEBOX_RUNS_MAX_CONCURRENT_RUNS`.
    pub env: String,
    /// `CODEBOX_MAX_CONCURRENT_RUNS`, when the key names this setting only.
    pub env_short: Option<String>,
    /// The docker CLI's variable that applies when nothing else sets it (`DOCKER_HOST`).
    pub env_fallback: Option<String>,
    /// The values a text setting may take, when they are a fixed set.
    pub choices: Vec<String>,
}

impl Config {
    /// Every setting, sorted by path, read off the structs' schema.
    pub fn settings() -> Vec<Setting> {
        let root = serde_json::to_value(schemars::schema_for!(Config)).unwrap_or_default();
        let defs = root.get("$defs").cloned().unwrap_or_default();
        let mut out = Vec::new();
        collect_settings(&root, &defs, "", &mut out);
        let mut keys: BTreeMap<String, usize> = BTreeMap::new();
        for s in &out {
            *keys.entry(last_key(&s.path).to_string()).or_default() += 1;
        }
        for s in &mut out {
            let key = last_key(&s.path);
            // Only distinctive keys: `CODEBOX_PATH` would be too easy to set by accident.
            if s.path.contains('.') && key.contains('_') && keys[key] == 1 {
                s.env_short = Some(env_name(key));
            }
            if let Some((var, _)) = SHORT_ALIASES.iter().find(|(_, p)| *p == s.path) {
                s.env_short = Some(var.to_string());
            }
            if let Some((_, var)) = DOCKER_ENV.iter().find(|(p, _)| *p == s.path) {
                s.env_fallback = Some(var.to_string());
            }
        }
        out
    }

    /// Resolve the configuration of this process: `file` (if any), then the variables `env`
    /// returns (injected so tests need no real environment), then `--set` items; validate.
    pub fn resolve(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
        sets: &[String],
    ) -> Result<Config, ConfigError> {
        let mut table = match file {
            None => toml::Table::new(),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                parse_table(&text).map_err(|message| ConfigError::Parse {
                    path: path.to_path_buf(),
                    message,
                })?
            }
        };
        let settings = Config::settings();
        for s in &settings {
            // The section-qualified name wins over the short one.
            let found = std::iter::once(&s.env)
                .chain(&s.env_short)
                .find_map(|var| env(var).filter(|v| !v.is_empty()).map(|v| (var, v)));
            if let Some((var, value)) = found {
                set_in(&mut table, s, &value, Source::Env(var.clone()))?;
            }
        }
        for item in sets {
            let Some((path, value)) = item.split_once('=') else {
                return Err(ConfigError::SetSyntax { item: item.clone() });
            };
            let path = path.trim();
            let Some(s) = settings.iter().find(|s| s.path == path) else {
                return Err(ConfigError::Unknown {
                    setting: path.to_string(),
                    origin: Source::Flag,
                });
            };
            set_in(&mut table, s, value, Source::Flag)?;
        }
        let mut config = from_table(table, file)?;
        config.docker = config.docker.or_docker_env(env);
        config.validate()?;
        Ok(config)
    }

    /// Parse and validate config-file text on its own (no variables, no flags).
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let table = parse_table(text).map_err(|message| ConfigError::Parse {
            path: PathBuf::new(),
            message,
        })?;
        let config = from_table(table, None)?;
        config.validate()?;
        Ok(config)
    }

    /// The configuration as a config file (what `codebox config` prints). The token itself
    /// is never part of it.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the config: {e}\n"))
    }

    /// The SQLite history file (used when `history.url` is unset).
    pub fn history_path(&self) -> PathBuf {
        self.history
            .path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(DEFAULT_HISTORY_FILE))
    }

    /// Where the history lives: PostgreSQL when `history.url` is set, else the SQLite file.
    pub fn history_store(&self) -> HistoryStore {
        match &self.history.url {
            Some(url) => HistoryStore::Postgres {
                url: url.clone(),
                password_file: self.history.password_file.clone(),
            },
            None => HistoryStore::Sqlite(self.history_path()),
        }
    }

    /// Check every setting once, at start.
    pub fn validate(&self) -> Result<(), ConfigError> {
        fn invalid(setting: &str, value: impl ToString, reason: &str) -> ConfigError {
            ConfigError::Invalid {
                setting: setting.to_string(),
                value: value.to_string(),
                reason: reason.to_string(),
            }
        }
        let l = &self.limits;
        if l.max_memory_mb == 0 || l.max_memory_mb > 1 << 20 {
            return Err(invalid(
                "limits.max_memory_mb",
                l.max_memory_mb,
                "must be between 1 and 1048576",
            ));
        }
        if l.default_memory_mb < 6 || l.default_memory_mb > l.max_memory_mb {
            return Err(invalid(
                "limits.default_memory_mb",
                l.default_memory_mb,
                &format!(
                    "must be between 6 and limits.max_memory_mb ({})",
                    l.max_memory_mb
                ),
            ));
        }
        for (name, v) in [
            ("limits.max_timeout_seconds", l.max_timeout_seconds),
            ("limits.max_cpus", l.max_cpus),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(invalid(name, v, "must be a positive number"));
            }
        }
        for (name, v, max, max_name) in [
            (
                "limits.default_timeout_seconds",
                l.default_timeout_seconds,
                l.max_timeout_seconds,
                "limits.max_timeout_seconds",
            ),
            (
                "limits.default_cpus",
                l.default_cpus,
                l.max_cpus,
                "limits.max_cpus",
            ),
        ] {
            if !(v.is_finite() && v > 0.0 && v <= max) {
                return Err(invalid(
                    name,
                    v,
                    &format!("must be positive and at most {max_name} ({max})"),
                ));
            }
        }
        let s = &self.sandbox;
        if s.pids_limit < 8 {
            return Err(invalid(
                "sandbox.pids_limit",
                s.pids_limit,
                "must be at least 8",
            ));
        }
        if s.runtime.trim().is_empty() || s.runtime.contains(char::is_whitespace) {
            return Err(invalid(
                "sandbox.runtime",
                format!("{:?}", s.runtime),
                "must name an OCI runtime registered with the daemon, e.g. runc or runsc",
            ));
        }
        if s.workspace_mb < 1 || s.workspace_mb * 2 > l.default_memory_mb {
            return Err(invalid(
                "sandbox.workspace_mb",
                s.workspace_mb,
                &format!(
                    "must be between 1 and half of limits.default_memory_mb ({} MB)",
                    l.default_memory_mb / 2
                ),
            ));
        }
        for (name, v) in [
            ("sandbox.output_limit_bytes", s.output_limit_bytes),
            ("sandbox.max_output_bytes", s.max_output_bytes),
            ("sandbox.max_output_file_bytes", s.max_output_file_bytes),
            ("sandbox.tmpfs_mb", s.tmpfs_mb),
            ("sandbox.max_file_size_mb", s.max_file_size_mb),
            ("sandbox.max_code_bytes", s.max_code_bytes as u64),
            ("sandbox.max_arg_bytes", s.max_arg_bytes as u64),
        ] {
            if v == 0 {
                return Err(invalid(name, 0, "must be positive"));
            }
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
        if r.memory_budget_mb < l.default_memory_mb {
            return Err(invalid(
                "runs.memory_budget_mb",
                r.memory_budget_mb,
                &format!(
                    "must be at least limits.default_memory_mb ({})",
                    l.default_memory_mb
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
        let p = &self.pool;
        let pooled: usize = p.sizes.values().sum();
        if pooled > 16 {
            return Err(invalid(
                "pool.sizes",
                pooled,
                "must keep at most 16 containers in all (each holds one of the 64 sandbox users)",
            ));
        }
        if p.idle_seconds < 10 {
            return Err(invalid(
                "pool.idle_seconds",
                p.idle_seconds,
                "must be at least 10",
            ));
        }
        let hist = &self.history;
        if let Some(url) = &hist.url {
            check_postgres_url(url).map_err(|reason| {
                invalid(
                    "history.url",
                    format!("{:?}", redact_password(url)),
                    &reason,
                )
            })?;
            if let Some(path) = &hist.path {
                return Err(invalid(
                    "history.path",
                    path.display(),
                    "is the SQLite file, but history.url is set too: set one of them",
                ));
            }
        } else if let Some(file) = &hist.password_file {
            return Err(invalid(
                "history.password_file",
                file.display(),
                "is only used with history.url (PostgreSQL)",
            ));
        }
        let d = &self.docker;
        if let Some(host) = &d.host {
            let ok = match host.split_once("://") {
                Some(("unix", path)) => path.starts_with('/'),
                Some(("tcp", rest)) => rest
                    .trim_end_matches('/')
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
                _ => false,
            };
            if !ok {
                return Err(invalid(
                    "docker.host",
                    format!("{host:?}"),
                    "must be unix:///path/to/docker.sock or tcp://HOST:PORT (the setting, else DOCKER_HOST)",
                ));
            }
        }
        if let Some(network) = &d.build_network {
            if network.trim().is_empty() || network.contains(char::is_whitespace) {
                return Err(invalid(
                    "docker.build_network",
                    format!("{network:?}"),
                    "must name a network mode, e.g. host",
                ));
            }
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
        self.sessions.validate(self)
    }
}

/// The typed configuration of a table; an error names the setting it is about.
fn from_table(table: toml::Table, file: Option<&Path>) -> Result<Config, ConfigError> {
    serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| {
        let setting = e.path().to_string();
        let message = e.into_inner().message().to_string();
        ConfigError::Parse {
            path: file.map(Path::to_path_buf).unwrap_or_default(),
            message: if setting.is_empty() || setting == "." {
                message
            } else {
                format!("setting `{setting}`: {message}")
            },
        }
    })
}

fn parse_table(text: &str) -> Result<toml::Table, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| e.message().to_string())
}

fn last_key(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

fn env_name(path: &str) -> String {
    format!(
        "{ENV_PREFIX}{}",
        path.replace('.', "_").to_ascii_uppercase()
    )
}

/// Walk a JSON schema object's properties, recursing into nested sections.
fn collect_settings(
    schema: &serde_json::Value,
    defs: &serde_json::Value,
    prefix: &str,
    out: &mut Vec<Setting>,
) {
    let Some(props) = schema.get("properties").and_then(|p| p.as_object()) else {
        return;
    };
    for (key, prop) in props {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let resolved = resolve_ref(prop, defs);
        if resolved.get("properties").is_some() {
            collect_settings(&resolved, defs, &path, out);
            continue;
        }
        let doc = prop
            .get("description")
            .or_else(|| resolved.get("description"))
            .and_then(|d| d.as_str())
            .unwrap_or("")
            .to_string();
        let choices = resolved
            .get("enum")
            .and_then(|e| e.as_array())
            .map(|vs| {
                vs.iter()
                    .filter_map(|v| v.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Setting {
            env: env_name(&path),
            env_short: None,
            env_fallback: None,
            choices,
            kind: kind_of(&resolved),
            path,
            doc,
        });
    }
}

fn resolve_ref(prop: &serde_json::Value, defs: &serde_json::Value) -> serde_json::Value {
    match prop.get("$ref").and_then(|r| r.as_str()) {
        Some(r) => defs
            .get(r.trim_start_matches("#/$defs/"))
            .cloned()
            .unwrap_or_default(),
        None => prop.clone(),
    }
}

fn kind_of(schema: &serde_json::Value) -> Kind {
    let types: Vec<&str> = match schema.get("type") {
        Some(serde_json::Value::String(t)) => vec![t.as_str()],
        Some(serde_json::Value::Array(ts)) => ts.iter().filter_map(|t| t.as_str()).collect(),
        _ => Vec::new(),
    };
    let has = |t: &str| types.contains(&t);
    if has("integer") {
        Kind::Integer
    } else if has("number") {
        Kind::Number
    } else if has("boolean") {
        Kind::Boolean
    } else if has("array") {
        Kind::List
    } else if has("object") {
        Kind::Table
    } else {
        // Strings, paths and the enums (`one of`).
        Kind::Text
    }
}

/// Put one textual value into the config table at the setting's path, converted to its kind.
fn set_in(
    table: &mut toml::Table,
    setting: &Setting,
    text: &str,
    source: Source,
) -> Result<(), ConfigError> {
    let type_error = || ConfigError::Type {
        setting: setting.path.clone(),
        value: format!("{text:?}"),
        expected: setting.kind.name(),
        origin: source.clone(),
    };
    let t = text.trim();
    let value = match setting.kind {
        Kind::Integer => toml::Value::Integer(t.parse().map_err(|_| type_error())?),
        Kind::Number => {
            let v: f64 = t.parse().map_err(|_| type_error())?;
            toml::Value::Float(v)
        }
        Kind::Boolean => toml::Value::Boolean(t.parse().map_err(|_| type_error())?),
        Kind::Text if !setting.choices.is_empty() && !setting.choices.iter().any(|c| c == t) => {
            return Err(ConfigError::Invalid {
                setting: setting.path.clone(),
                value: format!("{text:?} ({source})"),
                reason: format!("must be one of {}", setting.choices.join(", ")),
            });
        }
        Kind::Text => toml::Value::String(t.to_string()),
        Kind::List if t.starts_with('[') => inline_value(t).ok_or_else(type_error)?,
        Kind::List => toml::Value::Array(
            t.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(|s| toml::Value::String(s.to_string()))
                .collect(),
        ),
        Kind::Table => inline_value(t)
            .filter(|v| v.is_table())
            .ok_or_else(type_error)?,
    };
    let mut node = table;
    let parts: Vec<&str> = setting.path.split('.').collect();
    for part in &parts[..parts.len() - 1] {
        let entry = node
            .entry(part.to_string())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        let Some(inner) = entry.as_table_mut() else {
            return Err(ConfigError::Unknown {
                setting: setting.path.clone(),
                origin: source,
            });
        };
        node = inner;
    }
    node.insert(parts[parts.len() - 1].to_string(), value);
    Ok(())
}

/// A TOML value written inline (`[1, 2]`, `{ a = 1 }`).
fn inline_value(text: &str) -> Option<toml::Value> {
    let table: toml::Table = toml::from_str(&format!("v = {text}")).ok()?;
    table.get("v").cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn shipped_defaults_match_the_contract() {
        let c = Config::default();
        assert_eq!(c.limits.default_memory_mb, 512);
        assert_eq!(c.limits.max_memory_mb, 16384);
        assert_eq!(c.limits.default_timeout_seconds, 30.0);
        assert_eq!(c.limits.max_timeout_seconds, 3600.0);
        assert_eq!(c.limits.default_cpus, 1.0);
        assert_eq!(c.limits.max_cpus, 4.0);
        assert_eq!(c.sandbox.pids_limit, 256);
        assert_eq!(c.sandbox.output_limit_bytes, 1 << 20);
        assert_eq!(c.runs.max_concurrent_runs, 4);
        assert_eq!(c.runs.result_retention_seconds, 3600);
        assert_eq!(c.runs.retained_reports_mb, 256);
        assert_eq!(c.history.code, CodePolicy::Preview);
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
    fn every_setting_has_a_file_key_a_flag_and_a_variable() {
        let settings = Config::settings();
        for path in [
            "data_dir",
            "languages",
            "limits.default_cpus",
            "limits.max_cpus",
            "sandbox.pids_limit",
            "sandbox.max_args",
            "sandbox.max_arg_bytes",
            "runs.max_concurrent_runs",
            "history.path",
            "history.code",
            "http.allowed_hosts",
            "http.token_file",
        ] {
            let s = settings
                .iter()
                .find(|s| s.path == path)
                .unwrap_or_else(|| panic!("{path} is not a setting"));
            assert!(!s.doc.is_empty(), "{path} has no documentation");
            assert_eq!(s.env, env_name(path));
        }
        for s in &settings {
            for var in std::iter::once(&s.env).chain(&s.env_short) {
                assert!(!RESERVED_ENV.contains(&var.as_str()), "{var}");
            }
        }
        // The variables documented before settings were derived keep working.
        for (var, path) in [
            ("CODEBOX_DATA_DIR", "data_dir"),
            ("CODEBOX_DEFAULT_MEMORY_MB", "limits.default_memory_mb"),
            ("CODEBOX_MAX_CONCURRENT_RUNS", "runs.max_concurrent_runs"),
            ("CODEBOX_RETAINED_REPORTS_MB", "runs.retained_reports_mb"),
            ("CODEBOX_HISTORY_PATH", "history.path"),
            ("CODEBOX_HISTORY_CODE", "history.code"),
            ("CODEBOX_LISTEN", "http.listen"),
            ("CODEBOX_ALLOWED_HOSTS", "http.allowed_hosts"),
            ("CODEBOX_MAX_BODY_BYTES", "http.max_body_bytes"),
        ] {
            let s = settings.iter().find(|s| s.path == path).unwrap();
            assert!(
                s.env == var || s.env_short.as_deref() == Some(var),
                "{var} does not set {path}: {s:?}"
            );
        }
    }

    #[test]
    fn file_then_variables_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[runs]\nmax_concurrent_runs = 3\nmax_queued_runs = 7\n[sandbox]\npids_limit = 100\n",
        )
        .unwrap();
        let env = |k: &str| match k {
            "CODEBOX_MAX_CONCURRENT_RUNS" => Some("2".to_string()),
            "CODEBOX_SANDBOX_PIDS_LIMIT" => Some("90".to_string()),
            "CODEBOX_PIDS_LIMIT" => Some("80".to_string()),
            "CODEBOX_ALLOWED_HOSTS" => Some("a.example, b.example".to_string()),
            "CODEBOX_HISTORY_CODE" => Some("full".to_string()),
            _ => None,
        };
        let c = Config::resolve(
            Some(&file),
            env,
            &["sandbox.pids_limit=64".into(), "limits.max_cpus=2".into()],
        )
        .unwrap();
        assert_eq!(c.runs.max_concurrent_runs, 2, "a variable beats the file");
        assert_eq!(c.runs.max_queued_runs, 7, "the file beats the default");
        assert_eq!(c.sandbox.pids_limit, 64, "a flag beats everything");
        assert_eq!(c.limits.max_cpus, 2.0);
        assert_eq!(c.http.allowed_hosts, ["a.example", "b.example"]);
        assert_eq!(c.history.code, CodePolicy::Full);
        let c = Config::resolve(Some(&file), env, &[]).unwrap();
        assert_eq!(
            c.sandbox.pids_limit, 90,
            "the section-qualified variable wins over the short one"
        );
    }

    #[test]
    fn docker_settings_beat_the_docker_cli_variables_which_beat_the_default() {
        let cli_env = |k: &str| match k {
            "DOCKER_HOST" => Some("tcp://10.0.0.5:2376".to_string()),
            "DOCKER_TLS_VERIFY" => Some("1".to_string()),
            "DOCKER_CERT_PATH" => Some("/certs".to_string()),
            _ => None,
        };
        let c = Config::resolve(None, no_env, &[]).unwrap();
        assert_eq!(c.docker.address(), DEFAULT_DOCKER_HOST);
        assert!(!c.docker.uses_tls());

        let c = Config::resolve(None, cli_env, &[]).unwrap();
        assert_eq!(c.docker.address(), "tcp://10.0.0.5:2376");
        assert!(c.docker.uses_tls());
        assert_eq!(c.docker.cert_dir(), PathBuf::from("/certs"));
        assert_eq!(
            c.docker.cli_env(),
            [
                ("DOCKER_HOST", "tcp://10.0.0.5:2376".to_string()),
                ("DOCKER_TLS_VERIFY", "1".to_string()),
                ("DOCKER_CERT_PATH", "/certs".to_string())
            ]
        );

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[docker]\nhost = \"tcp://docker.example:2376\"\ncert_path = \"/etc/codebox/docker\"\n",
        )
        .unwrap();
        let c = Config::resolve(Some(&file), cli_env, &[]).unwrap();
        assert_eq!(c.docker.address(), "tcp://docker.example:2376");
        assert_eq!(c.docker.cert_dir(), PathBuf::from("/etc/codebox/docker"));
        assert!(
            c.docker.uses_tls(),
            "DOCKER_TLS_VERIFY fills what the file leaves unset"
        );
        let c = Config::resolve(
            Some(&file),
            cli_env,
            &["docker.host=unix:///run/other.sock".into()],
        )
        .unwrap();
        assert_eq!(c.docker.address(), "unix:///run/other.sock");
        assert!(!c.docker.uses_tls(), "TLS is for tcp:// only");
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c);

        let settings = Config::settings();
        let host = settings.iter().find(|s| s.path == "docker.host").unwrap();
        assert_eq!(host.env, "CODEBOX_DOCKER_HOST");
        assert_eq!(host.env_fallback.as_deref(), Some("DOCKER_HOST"));

        for bad in [
            "ssh://me@host",
            "tcp://host",
            "host:2376",
            "unix://relative.sock",
        ] {
            let msg = Config::resolve(None, no_env, &[format!("docker.host={bad}")])
                .unwrap_err()
                .to_string();
            assert!(msg.contains("docker.host") && msg.contains(bad), "{msg}");
        }
    }

    #[test]
    fn bad_values_name_the_setting_the_value_and_where_it_came_from() {
        let env = |k: &str| (k == "CODEBOX_MAX_CONCURRENT_RUNS").then(|| "lots".to_string());
        let msg = Config::resolve(None, env, &[]).unwrap_err().to_string();
        assert!(
            msg.contains("runs.max_concurrent_runs")
                && msg.contains("lots")
                && msg.contains("CODEBOX_MAX_CONCURRENT_RUNS"),
            "{msg}"
        );
        let msg = Config::resolve(None, no_env, &["runs.nope=1".into()])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("runs.nope") && msg.contains("--set"), "{msg}");
        let msg = Config::resolve(None, no_env, &["runs.max_queued_runs".into()])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("SETTING=VALUE"), "{msg}");
        let msg = Config::resolve(None, no_env, &["history.code=most".into()])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("most"), "{msg}");
        let msg = Config::resolve(None, no_env, &["runs.result_retention_seconds=5".into()])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("runs.result_retention_seconds"), "{msg}");
    }

    #[test]
    fn a_postgres_history_url_is_checked_and_never_holds_a_password() {
        let c = Config::resolve(
            None,
            no_env,
            &["history.url=postgres://codebox@db.internal:5433/codebox".into()],
        )
        .unwrap();
        assert!(
            matches!(c.history_store(), HistoryStore::Postgres { ref url, .. } if url.ends_with("/codebox"))
        );
        assert_eq!(
            Config::default().history_store(),
            HistoryStore::Sqlite(Config::default().data_dir.join(DEFAULT_HISTORY_FILE)),
            "SQLite stays the default"
        );
        let socket = "postgres://codebox@%2Frun%2Fpostgresql/codebox";
        let env = |k: &str| (k == "CODEBOX_HISTORY_URL").then(|| socket.to_string());
        assert_eq!(
            Config::resolve(None, env, &[])
                .unwrap()
                .history
                .url
                .as_deref(),
            Some(socket)
        );
        for (url, words) in [
            ("mysql://x@y/z", "postgres://"),
            ("postgres://codebox:hunter2@db/codebox", "password_file"),
            (
                "postgres://codebox@db/codebox?sslmode=verify-full&sslrootcert=%2Fno%2Fca.pem",
                "/no/ca.pem does not exist",
            ),
            ("postgres://codebox@db/codebox?sslmode=allow", "verify-ca"),
            ("postgres://codebox@db/codebox?bogus=1", "understands"),
        ] {
            let msg = Config::resolve(None, no_env, &[format!("history.url={url}")])
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains("history.url") && msg.contains(words),
                "{url}: {msg}"
            );
            assert!(
                !msg.contains("hunter2"),
                "the password is never repeated: {msg}"
            );
        }
        let msg = Config::resolve(
            None,
            no_env,
            &[
                "history.url=postgres://codebox@db/codebox".into(),
                "history.path=/x/h.sqlite3".into(),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains("history.path") && msg.contains("one of them"),
            "{msg}"
        );
        let msg = Config::resolve(None, no_env, &["history.password_file=/pw".into()])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("history.password_file"), "{msg}");
    }

    #[test]
    fn printed_config_reads_back_as_the_same_config() {
        let c = Config::resolve(
            None,
            no_env,
            &[
                "runs.max_concurrent_runs=3".into(),
                "history.code=none".into(),
                "history.path=/somewhere/h.sqlite3".into(),
                "http.listen=0.0.0.0:9000".into(),
                "http.allowed_hosts=x.example".into(),
                "sandbox.max_args=9".into(),
                "limits.default_cpus=0.5".into(),
            ],
        )
        .unwrap();
        let again = Config::from_toml(&c.to_toml()).unwrap();
        assert_eq!(again, c);
        assert_eq!(
            Config::from_toml(&Config::default().to_toml()).unwrap(),
            Config::default()
        );
    }
}
