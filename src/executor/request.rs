//! A run request as a client sends it, and its validation. Everything is checked here, before
//! Docker is touched; every error names the field and the allowed range.

use std::path::{Component, Path};

use base64::Engine as _;
use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::{fmt_num, RunLimits};

/// Encoding of a file's `content`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// An extra file placed in the workspace next to the source file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    /// Relative path inside the workspace (e.g. `data/input.csv`); no `..`, not absolute.
    pub path: String,
    /// File content, as text or base64.
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<Encoding>,
}

/// Limits a client may ask for; anything left out takes the operator's default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsInput {
    /// Memory limit in MB (whole number).
    pub memory_mb: Option<f64>,
    /// Wall-clock limit of the run stage in seconds.
    pub timeout_seconds: Option<f64>,
    /// CPU quota in cores (may be fractional, e.g. 0.5).
    pub cpus: Option<f64>,
}

/// One test case of a run: its own stdin and arguments, and what it should print.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TestInput {
    /// A name for the report (default: `test-1`, `test-2`...).
    #[serde(default)]
    pub name: Option<String>,
    /// Text written to the program's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Command-line arguments.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// What stdout should be; the case passes when it matches (see `compare`). Without it,
    /// `passed` is null.
    #[serde(default)]
    pub expected_stdout: Option<String>,
}

/// How a test case's stdout is compared with `expected_stdout`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// Trailing whitespace of each line, and trailing empty lines, are ignored.
    #[default]
    Trim,
    /// Byte for byte.
    Exact,
}

impl Compare {
    /// Whether `actual` matches `expected` under this comparison.
    pub fn matches(self, expected: &str, actual: &str) -> bool {
        match self {
            Compare::Exact => expected == actual,
            Compare::Trim => trimmed_lines(expected) == trimmed_lines(actual),
        }
    }
}

/// The lines of `s` without trailing whitespace, without trailing empty lines.
fn trimmed_lines(s: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = s.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

/// Most test cases in one request.
pub const MAX_TESTS: usize = 64;

/// The shortest wall-clock limit a request may ask for. `codebox-init` counts whole
/// milliseconds and reads 0 as "no deadline", so a shorter limit would not be enforced (the
/// protocol fuzzer found that a 0.0004 s limit let a 3 s program finish).
pub const MIN_TIMEOUT_SECONDS: f64 = 0.001;

/// What a client asks to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Language id or alias (see `list_supported_languages`).
    pub language: String,
    /// The program's source code.
    pub code: String,
    /// Text written to the program's standard input.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Command-line arguments passed to the program.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Extra files placed in the workspace.
    #[serde(default)]
    pub files: Option<Vec<FileInput>>,
    /// Resource limits; defaults apply to what is left out.
    #[serde(default)]
    pub limits: Option<LimitsInput>,
    /// Test cases (at most 64): the program is compiled once, then each case runs in a fresh
    /// container of its own with its stdin and args. Not together with `stdin` or `args`.
    #[serde(default)]
    pub tests: Option<Vec<TestInput>>,
    /// How `expected_stdout` is compared: `trim` (default) or `exact`.
    #[serde(default)]
    pub compare: Option<Compare>,
}

/// A test case that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidTest {
    pub name: String,
    pub stdin: Option<Bytes>,
    pub args: Vec<String>,
    pub expected_stdout: Option<String>,
}

/// A request that passed validation.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidRequest {
    pub language: Language,
    pub code: String,
    pub stdin: Option<Bytes>,
    pub args: Vec<String>,
    pub files: Vec<(String, Bytes)>,
    pub limits: RunLimits,
    /// Empty for a single run.
    pub tests: Vec<ValidTest>,
    pub compare: Compare,
}

/// A rejected request: which field, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    pub field: String,
    pub message: String,
}

fn reject<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, RequestError> {
    Err(RequestError {
        field: field.into(),
        message: message.into(),
    })
}

/// Check one client-set limit: finite, positive, not over the ceiling. Never clamped.
fn limit(
    field: &str,
    requested: Option<f64>,
    default: f64,
    ceiling: f64,
    what: &str,
    unit: &str,
) -> Result<f64, RequestError> {
    let Some(v) = requested else {
        return Ok(default);
    };
    if !v.is_finite() {
        return reject(
            field,
            format!("must be a finite number (1 to {} {unit})", fmt_num(ceiling)),
        );
    }
    if v <= 0.0 {
        return reject(
            field,
            format!(
                "must be positive; requested {}{unit_sep}{unit} (allowed: up to {} {unit})",
                fmt_num(v),
                fmt_num(ceiling),
                unit_sep = if unit.is_empty() { "" } else { " " }
            ),
        );
    }
    if v > ceiling {
        return reject(
            field,
            format!(
                "requested {} {unit} of {what}; the maximum is {} {unit}",
                fmt_num(v),
                fmt_num(ceiling)
            ),
        );
    }
    Ok(v)
}

/// Check a workspace-relative file path.
fn check_path(field: &str, path: &str, source_file: &str) -> Result<String, RequestError> {
    if path.is_empty() || path.len() > 255 {
        return reject(field, "must be a relative path of 1 to 255 bytes");
    }
    if path.contains('\0') || path.contains('\\') {
        return reject(field, format!("`{path}` contains a forbidden character"));
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return reject(
            field,
            format!("`{path}` is absolute; use a path relative to the workspace"),
        );
    }
    for c in p.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return reject(
                    field,
                    format!("`{path}` contains `..`; paths must stay inside the workspace"),
                )
            }
            _ => return reject(field, format!("`{path}` must be a plain relative path")),
        }
    }
    let normal: Vec<&str> = p
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .map(|c| c.as_os_str().to_str().unwrap_or(""))
        .collect();
    if normal.is_empty() {
        return reject(field, format!("`{path}` names no file"));
    }
    let joined = normal.join("/");
    if joined == source_file || joined.starts_with(&format!("{source_file}/")) {
        return reject(
            field,
            format!("`{path}` clashes with the source file `{source_file}`"),
        );
    }
    Ok(joined)
}

impl ValidRequest {
    /// Validate a request against the registry and the operator's limits.
    pub fn new(
        req: RunRequest,
        registry: &Registry,
        config: &Config,
    ) -> Result<ValidRequest, RequestError> {
        let Some(language) = registry.resolve(&req.language) else {
            let known: Vec<&str> = registry.languages.keys().map(String::as_str).collect();
            return reject(
                "language",
                format!(
                    "unknown language `{}`; supported: {}",
                    req.language,
                    known.join(", ")
                ),
            );
        };
        let s = &config.sandbox;
        if req.code.trim().is_empty() {
            return reject("code", "must not be empty");
        }
        if req.code.len() > s.max_code_bytes {
            return reject(
                "code",
                format!(
                    "is {} bytes; the maximum is {} bytes",
                    req.code.len(),
                    s.max_code_bytes
                ),
            );
        }
        let stdin = check_stdin("stdin", req.stdin, config)?;
        let args = check_args("args", req.args, config)?;
        let tests = req.tests.unwrap_or_default();
        if !tests.is_empty() && (stdin.is_some() || !args.is_empty()) {
            return reject(
                "tests",
                "cannot be combined with top-level stdin or args; give each case its own",
            );
        }
        if tests.len() > MAX_TESTS {
            return reject(
                "tests",
                format!("has {} cases; the maximum is {MAX_TESTS}", tests.len()),
            );
        }
        let mut valid_tests = Vec::with_capacity(tests.len());
        for (i, t) in tests.into_iter().enumerate() {
            let name = t.name.unwrap_or_else(|| format!("test-{}", i + 1));
            if name.is_empty() || name.len() > 128 || name.contains(char::is_control) {
                return reject(
                    format!("tests[{i}].name"),
                    "must be 1 to 128 characters, none of them control characters",
                );
            }
            if let Some(e) = &t.expected_stdout {
                if e.len() > config.sandbox.output_limit_bytes as usize {
                    return reject(
                        format!("tests[{i}].expected_stdout"),
                        format!(
                            "is {} bytes; output is kept up to {} bytes",
                            e.len(),
                            config.sandbox.output_limit_bytes
                        ),
                    );
                }
            }
            valid_tests.push(ValidTest {
                name,
                stdin: check_stdin(&format!("tests[{i}].stdin"), t.stdin, config)?,
                args: check_args(&format!("tests[{i}].args"), t.args, config)?,
                expected_stdout: t.expected_stdout,
            });
        }
        let raw_files = req.files.unwrap_or_default();
        if raw_files.len() > s.max_files {
            return reject(
                "files",
                format!(
                    "has {} files; the maximum is {}",
                    raw_files.len(),
                    s.max_files
                ),
            );
        }
        let mut files: Vec<(String, Bytes)> = Vec::new();
        let mut total = 0usize;
        for (i, f) in raw_files.into_iter().enumerate() {
            let field = format!("files[{i}].path");
            let path = check_path(&field, &f.path, &language.source_file)?;
            if files.iter().any(|(p, _)| *p == path) {
                return reject(field, format!("`{path}` appears twice"));
            }
            // A file may not be both a file and a directory of another file.
            if files.iter().any(|(p, _)| {
                p.starts_with(&format!("{path}/")) || path.starts_with(&format!("{p}/"))
            }) {
                return reject(
                    field,
                    format!("`{path}` clashes with another file's directory"),
                );
            }
            let content = match f.encoding.unwrap_or_default() {
                Encoding::Utf8 => f.content.into_bytes(),
                Encoding::Base64 => base64::engine::general_purpose::STANDARD
                    .decode(f.content.trim())
                    .map_err(|e| RequestError {
                        field: format!("files[{i}].content"),
                        message: format!("is not valid base64: {e}"),
                    })?,
            };
            total += content.len();
            if total > s.max_files_bytes {
                return reject(
                    "files",
                    format!(
                        "total {total}+ bytes; the maximum is {} bytes",
                        s.max_files_bytes
                    ),
                );
            }
            files.push((path, Bytes::from(content)));
        }
        let l = req.limits.unwrap_or_default();
        let (d, c) = (config.limits.defaults(), config.ceilings());
        let memory = limit(
            "limits.memory_mb",
            l.memory_mb,
            d.memory_mb as f64,
            c.memory_mb as f64,
            "memory",
            "MB",
        )?;
        if memory.fract() != 0.0 {
            return reject(
                "limits.memory_mb",
                format!("must be a whole number of MB; requested {memory}"),
            );
        }
        if memory < 6.0 {
            return reject(
                "limits.memory_mb",
                format!("requested {memory} MB; the minimum is 6 MB"),
            );
        }
        let timeout = limit(
            "limits.timeout_seconds",
            l.timeout_seconds,
            d.timeout_seconds,
            c.timeout_seconds,
            "wall-clock time",
            "s",
        )?;
        if timeout < MIN_TIMEOUT_SECONDS {
            return reject(
                "limits.timeout_seconds",
                format!("requested {timeout} s; the minimum is {MIN_TIMEOUT_SECONDS} s"),
            );
        }
        let cpus = limit("limits.cpus", l.cpus, d.cpus, c.cpus, "CPU", "cpus")?;
        if cpus < 0.01 {
            return reject(
                "limits.cpus",
                format!("requested {cpus} cpus; the minimum is 0.01"),
            );
        }
        // The source and files must fit the working directory (a tmpfs within the memory).
        let workspace_mb = config.sandbox.workspace_mb.min(memory as u64 / 2).max(1);
        let needed = req.code.len() + files.iter().map(|(_, c)| c.len()).sum::<usize>();
        if needed as u64 > workspace_mb * 1024 * 1024 {
            return reject(
                "files",
                format!(
                    "the code and files take {needed} bytes; a run with {memory} MB of memory has a {workspace_mb} MB working directory (at most half of limits.memory_mb)"
                ),
            );
        }
        Ok(ValidRequest {
            language: language.clone(),
            code: req.code,
            stdin,
            args,
            files,
            limits: RunLimits {
                memory_mb: memory as u64,
                timeout_seconds: timeout,
                cpus,
            },
            tests: valid_tests,
            compare: req.compare.unwrap_or_default(),
        })
    }
}

/// Check one stdin: within the cap; empty is none.
fn check_stdin(
    field: &str,
    stdin: Option<String>,
    config: &Config,
) -> Result<Option<Bytes>, RequestError> {
    let max = config.sandbox.max_stdin_bytes;
    match stdin {
        Some(text) if text.len() > max => reject(
            field,
            format!("is {} bytes; the maximum is {max} bytes", text.len()),
        ),
        Some(text) if !text.is_empty() => Ok(Some(Bytes::from(text.into_bytes()))),
        _ => Ok(None),
    }
}

/// Check one argument list: count and length caps, no NUL.
fn check_args(
    field: &str,
    args: Option<Vec<String>>,
    config: &Config,
) -> Result<Vec<String>, RequestError> {
    let s = &config.sandbox;
    let args = args.unwrap_or_default();
    if args.len() > s.max_args {
        return reject(
            field,
            format!("has {} items; the maximum is {}", args.len(), s.max_args),
        );
    }
    for (i, a) in args.iter().enumerate() {
        if a.len() > s.max_arg_bytes || a.contains('\0') {
            return reject(
                format!("{field}[{i}]"),
                format!(
                    "must be at most {} bytes with no NUL character",
                    s.max_arg_bytes
                ),
            );
        }
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::Compare;

    #[test]
    fn trim_ignores_trailing_whitespace_and_empty_lines_exact_does_not() {
        assert!(Compare::Trim.matches("a\nb\n", "a  \nb\n\n\n"));
        assert!(Compare::Trim.matches("a\r\nb", "a\nb\n"));
        assert!(!Compare::Trim.matches("a\nb", "a\n b"));
        assert!(!Compare::Trim.matches("a", "a\nb"));
        assert!(!Compare::Exact.matches("a\n", "a"));
        assert!(Compare::Exact.matches("a\n", "a\n"));
    }
}
