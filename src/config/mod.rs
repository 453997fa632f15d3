//! Operator settings: one struct per section, each field written once with its default and
//! its documentation (the [`section!`] macro), and checked once in [`validate`].
//!
//! Configuration is resolved once per process by [`resolve`], in one order: the
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

mod cluster;
mod defaults;
mod docker;
mod history;
mod packages;
mod postgres_tls;
mod sections;
mod sessions;
mod sources;
#[cfg(test)]
mod tests;
mod validate;

pub use cluster::{check_advertise_url, ClusterSettings, MIN_LEASE_SECONDS};
pub use defaults::defaults_toml;
pub use docker::*;
pub use history::*;
pub use packages::{split_host_port, Allowed, NpmRegistry, PackagesSettings, PythonIndex};
pub(crate) use postgres_tls::{split_tls, SslMode, TlsParams};
pub use sections::*;
pub(crate) use sessions::SessionSettings;
pub use sources::{from_toml, resolve, unknown_env};
pub use validate::validate;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::report::RunLimits;

use sources::{collect_settings, env_name, last_key};

section! {
    /// Everything codebox needs to know from its operator.
    pub struct Config {
        /// The language registry file. When unset: `languages.toml` in the current folder,
        /// else the executable's own (beside it, in the checkout whose `target/` holds it, or
        /// in `../share/codebox/`); `codebox config` and `codebox doctor` say which is used.
        #[serde(skip_serializing_if = "Option::is_none")]
        pub languages: Option<PathBuf> = None,
        /// Where codebox keeps its state: the history database and instance locks (default:
        /// the user's data folder, `~/.local/share/codebox` on Linux).
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
        pub cluster: ClusterSettings = ClusterSettings::default(),
        pub packages: PackagesSettings = PackagesSettings::default(),
    }
}

/// The user's data directory (e.g. `~/.local/share/codebox`).
fn default_data_dir() -> PathBuf {
    directories::ProjectDirs::from("", "", "codebox")
        .map(|d| d.data_dir().to_path_buf())
        .unwrap_or_else(|| PathBuf::from(".codebox"))
}

/// File name of the history database inside the data directory.
/// Most containers the pool holds at once, ready or starting (each holds a sandbox user).
pub(crate) const MAX_POOLED: usize = 16;
pub(crate) const DEFAULT_HISTORY_FILE: &str = "history.sqlite3";
/// The contract's floor for the retention: reports are kept at least an hour.
pub(crate) const MIN_RESULT_RETENTION_SECONDS: u64 = 3600;
/// Prefix of every configuration variable.
pub(crate) const ENV_PREFIX: &str = "CODEBOX_";
/// Short variables kept from before the names were derived (one-word keys, and keys that
/// later settings came to share).
const SHORT_ALIASES: [(&str, &str); 2] = [
    ("CODEBOX_LISTEN", "http.listen"),
    // Documented before `sessions.memory_budget_mb` shared its last key.
    ("CODEBOX_MEMORY_BUDGET_MB", "runs.memory_budget_mb"),
];
fn did_you_mean(nearest: &Option<String>) -> String {
    nearest
        .as_ref()
        .map(|n| format!("did you mean `{n}`? "))
        .unwrap_or_default()
}

/// Variables that begin with [`ENV_PREFIX`] but are not settings (and no setting may take
/// their name): the config file, the bearer token (a secret, never a setting) and the log filter.
pub(crate) const RESERVED_ENV: [&str; 3] = ["CODEBOX_CONFIG", "CODEBOX_TOKEN", "CODEBOX_LOG"];

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
    #[error("unknown setting `{setting}` ({origin}); {}`codebox config --list` lists them all", did_you_mean(.nearest))]
    Unknown {
        setting: String,
        origin: Source,
        /// The known setting nearest to the typo, if one is near.
        nearest: Option<String>,
    },
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

    /// The ceilings a client can reach: `limits.max_*`, except that no run can have more
    /// memory than the whole budget (`runs.memory_budget_mb`), so the smaller of the two is
    /// the memory ceiling everywhere one is stated or checked.
    pub fn ceilings(&self) -> RunLimits {
        let mut c = self.limits.settings_ceilings();
        c.memory_mb = c.memory_mb.min(self.runs.memory_budget_mb);
        c
    }

    /// The SQLite history file (used when `history.url` is unset).
    fn history_path(&self) -> PathBuf {
        self.history
            .path
            .clone()
            .unwrap_or_else(|| self.data_dir.join(DEFAULT_HISTORY_FILE))
    }

    /// Where the history lives: PostgreSQL when `history.url` is set, else the SQLite file.
    pub(crate) fn history_store(&self) -> HistoryStore {
        match &self.history.url {
            Some(url) => HistoryStore::Postgres {
                url: url.clone(),
                password_file: self.history.password_file.clone(),
            },
            None => HistoryStore::Sqlite(self.history_path()),
        }
    }

    /// The configuration as a config file (what `codebox config` prints). The token itself
    /// is never part of it.
    pub(crate) fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the config: {e}\n"))
    }
}
