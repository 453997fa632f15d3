//! The on-disk shape of `languages.toml`, as written. Unknown fields are rejected here;
//! meaning is checked in `super::validate`.

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawImage {
    pub tag: String,
    pub context: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    pub timeout_seconds: Option<f64>,
    pub memory_mb: Option<u64>,
    pub cpus: Option<f64>,
    pub workspace_mb: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExpect {
    pub status: String,
    pub stdout: Option<String>,
    pub stderr_contains: Option<String>,
    pub exit_code: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSample {
    pub name: String,
    pub code: String,
    pub stdin: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    pub expect: RawExpect,
}

/// How the Piston-compatible API names a language.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPiston {
    pub language: Option<String>,
    #[serde(default)]
    pub aliases: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLanguage {
    pub display_name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    /// File extensions `codebox run` recognises; defaults to the source file's.
    #[serde(default)]
    pub extensions: Vec<String>,
    pub image: String,
    pub source_file: String,
    /// A regular expression whose first group, where it matches the program, names the
    /// source file in place of `source_file`'s stem (javac wants a public class in a file of
    /// its name).
    pub source_name: Option<String>,
    pub compile: Option<Vec<String>>,
    /// A syntax check run in the run stage's container before the program.
    pub check: Option<Vec<String>>,
    pub run: Vec<String>,
    /// The check and the program in one process (one interpreter start), for runs.
    pub checked_run: Option<Vec<String>>,
    /// Command printing the toolchain version, run once when the image is built.
    pub version: Option<Vec<String>>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Libraries beyond the standard library that programs can use.
    #[serde(default)]
    pub packages: Vec<String>,
    pub compile_limits: Option<RawLimits>,
    /// Judge0 CE language ids served by this language (the first is its own).
    #[serde(default)]
    pub judge0_ids: Vec<i64>,
    /// Its name and extra aliases in the Piston-compatible API.
    pub piston: Option<RawPiston>,
    /// How sessions keep state: `{ driver = [...] }`; without it, sessions keep files only.
    pub session: Option<RawSession>,
    /// How its package manager installs requested packages into a prefix (SPEC 13).
    pub install: Option<RawInstall>,
    #[serde(default)]
    pub tests: Vec<RawSample>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInstall {
    /// The package manager's command; `{prefix}` and `{index}` are filled in, the
    /// requirements appended.
    pub command: Vec<String>,
    /// What makes the program see the prefix (`PYTHONPATH`, `NODE_PATH`, ...).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Where the program's container sees the installed prefix (read-only).
    pub prefix: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSession {
    /// The session driver's command (docs/sandbox-init.md, "The driver protocol").
    pub driver: Vec<String>,
}
