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

/// The uid:gid every container runs as. Images create this user and give it `/workspace`.
pub const SANDBOX_USER: &str = "10001:10001";

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

/// Everything the executor needs to know from the operator.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub limits: LimitPolicy,
    pub sandbox: SandboxPolicy,
    /// Path of `languages.toml`.
    pub languages_path: Option<PathBuf>,
    /// Where codebox keeps its state (history, instance locks).
    pub data_dir: PathBuf,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            limits: LimitPolicy::default(),
            sandbox: SandboxPolicy::default(),
            languages_path: None,
            data_dir: default_data_dir(),
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

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    sandbox: RawSandbox,
    languages: Option<PathBuf>,
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    default_memory_mb: Option<u64>,
    max_memory_mb: Option<u64>,
    default_timeout_seconds: Option<f64>,
    max_timeout_seconds: Option<f64>,
    default_cpus: Option<f64>,
    max_cpus: Option<f64>,
}

#[derive(Debug, Default, Deserialize)]
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
        c.validate()?;
        Ok(c)
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
            return Err(invalid("limits.max_memory_mb", c.memory_mb, "must be positive"));
        }
        if d.memory_mb == 0 || d.memory_mb > c.memory_mb {
            return Err(invalid(
                "limits.default_memory_mb",
                d.memory_mb,
                &format!("must be between 1 and limits.max_memory_mb ({})", c.memory_mb),
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
            return Err(invalid("sandbox.pids_limit", s.pids_limit, "must be at least 8"));
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
        Ok(())
    }
}

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
}
