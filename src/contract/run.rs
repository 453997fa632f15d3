//! A run request as a client sends it, and its validation. Everything is checked here, before
//! Docker is touched; every error names the field and the allowed range.

use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{
    check_args, check_stdin, reject, resolve_language, RequestError, MIN_TIMEOUT_SECONDS,
};
use super::files::{check_files, FileInput};
use super::limits::{check_limits, LimitsInput};
use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::{fmt_num, RunLimits};

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

/// Compile-stage limits a caller may lower (never raise) below the operator's for one run:
/// what the Piston-compatible API's `compile_timeout` and `compile_memory_limit` ask for. Not
/// one of the MCP or `/v1` arguments.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CompileLimitsInput {
    pub timeout_seconds: Option<f64>,
    pub memory_mb: Option<u64>,
}

/// Most test cases in one request.
pub const MAX_TESTS: usize = 64;

/// What a client asks to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// Language id or alias (see `list_supported_languages`); may be left out with
    /// `session_id`.
    #[serde(default)]
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
    /// Execute in this session (`create_session`): its files, and for stateful languages its
    /// interpreter's state, are kept between executions.
    #[serde(default)]
    pub session_id: Option<String>,
    /// With `session_id`: start a fresh interpreter (files kept) before running `code`.
    #[serde(default)]
    pub reset: Option<bool>,
    /// Packages to install before the program runs (at most 32), each a requirement in the
    /// package manager's own syntax (`requests==2.32.3`, `lodash@^4`). Only for languages
    /// whose `list_supported_languages` entry names a package index; the program still has no
    /// network. With `session_id`: installed into that session (kept for its life, its state
    /// kept); a session's packages only grow.
    #[serde(default)]
    pub packages: Option<Vec<String>>,
    /// Lower compile-stage limits for this run (see [`CompileLimitsInput`]).
    #[serde(skip)]
    #[schemars(skip)]
    pub compile_limits: Option<CompileLimitsInput>,
}

/// The session a request executes in.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionTarget {
    pub id: String,
    pub reset: bool,
}

/// What a session fixes for its executions.
#[derive(Debug, Clone, Copy)]
pub struct SessionTerms<'a> {
    pub language: &'a Language,
    /// Memory and CPU fixed at creation; the timeout is the default of each execution.
    pub limits: RunLimits,
    /// Most bytes the `files` of one call may hold.
    pub max_upload_bytes: usize,
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
    /// The session it executes in, if any.
    pub session: Option<SessionTarget>,
    /// Requirements to install first, sorted, without repeats (SPEC 13).
    pub packages: Vec<String>,
}

impl ValidRequest {
    /// Validate a request against the registry and the operator's limits.
    pub fn new(
        req: RunRequest,
        registry: &Registry,
        config: &Config,
    ) -> Result<ValidRequest, RequestError> {
        if req.session_id.is_some() || req.reset.is_some() {
            return reject(
                if req.session_id.is_some() {
                    "session_id"
                } else {
                    "reset"
                },
                "this request names a session; it is executed by the session's server",
            );
        }
        let language = resolve_language(registry, &req.language)?;
        ValidRequest::checked(req, language, config, None)
    }

    /// Validate an execution in a session: the session fixes the language, memory and CPU;
    /// `tests` and (for a stateful language) `args` do not apply.
    pub(crate) fn for_session(
        mut req: RunRequest,
        registry: &Registry,
        terms: SessionTerms<'_>,
        config: &Config,
    ) -> Result<ValidRequest, RequestError> {
        let language = terms.language;
        if !req.language.is_empty()
            && registry.resolve(&req.language).map(|l| &l.id) != Some(&language.id)
        {
            return reject(
                "language",
                format!(
                    "the session runs `{}`; `{}` cannot run in it (leave language out, or create a session for it)",
                    language.id, req.language
                ),
            );
        }
        if let Some(l) = &req.limits {
            for (field, given) in [
                ("limits.memory_mb", l.memory_mb.is_some()),
                ("limits.cpus", l.cpus.is_some()),
            ] {
                if given {
                    return reject(
                        field,
                        "is fixed for the session when it is created; only limits.timeout_seconds may be given per execution",
                    );
                }
            }
        }
        if req.tests.is_some() || req.compare.is_some() {
            return reject(
                "tests",
                "test cases (and compare) are for runs, not session executions",
            );
        }
        if language.is_stateful() && req.args.as_ref().is_some_and(|a| !a.is_empty()) {
            return reject(
                "args",
                format!(
                    "a `{}` session keeps an interpreter running; there is no program to pass arguments to",
                    language.id
                ),
            );
        }
        let target = SessionTarget {
            id: req.session_id.take().unwrap_or_default(),
            reset: req.reset.take().unwrap_or(false),
        };
        let mut valid = ValidRequest::checked(req, language, config, Some(terms))?;
        valid.session = Some(target);
        Ok(valid)
    }

    fn checked(
        req: RunRequest,
        language: &Language,
        config: &Config,
        session: Option<SessionTerms<'_>>,
    ) -> Result<ValidRequest, RequestError> {
        let mut language = language.clone();
        language.name_after(&req.code);
        if let Some(lower) = req.compile_limits {
            lower_compile_limits(&mut language, lower)?;
        }
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
        let packages = check_packages(req.packages, &language, config)?;
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
        // A stateful session has no source file to clash with.
        let source = match session {
            Some(_) if language.is_stateful() => "",
            _ => language.source_file.as_str(),
        };
        let max_total = session.map_or(s.max_files_bytes, |t| t.max_upload_bytes);
        let files = check_files(req.files, source, max_total, config)?;
        let (d, c) = match session {
            Some(t) => (t.limits, config.ceilings()),
            None => (config.limits.defaults(), config.ceilings()),
        };
        let limits = check_limits(req.limits, d, c)?;
        let memory = limits.memory_mb;
        // The source and files must fit the working directory (a tmpfs within the memory).
        // A session's own working directory is checked by its container (ENOSPC).
        let workspace_mb = config.sandbox.workspace_mb.min(memory / 2).max(1);
        let needed = req.code.len() + files.iter().map(|(_, c)| c.len()).sum::<usize>();
        if session.is_none() && needed as u64 > workspace_mb * 1024 * 1024 {
            return reject(
                "files",
                format!(
                    "the code and files take {needed} bytes; a run with {memory} MB of memory has a {workspace_mb} MB working directory (at most half of limits.memory_mb)"
                ),
            );
        }
        Ok(ValidRequest {
            language,
            code: req.code,
            stdin,
            args,
            files,
            limits,
            tests: valid_tests,
            compare: req.compare.unwrap_or_default(),
            session: None,
            packages,
        })
    }
}

/// Most requirements in one request's `packages`.
pub(crate) const MAX_PACKAGES: usize = 32;

/// A request's `packages`: allowed only where the operator named the language's index; each
/// a requirement of at most 200 printable characters that is not an option of the package
/// manager. Sorted, repeats dropped.
pub(super) fn check_packages(
    packages: Option<Vec<String>>,
    language: &Language,
    config: &Config,
) -> Result<Vec<String>, RequestError> {
    let packages = packages.unwrap_or_default();
    if packages.is_empty() {
        return Ok(packages);
    }
    if language.install.is_none() {
        return reject(
            "packages",
            format!(
                "{} takes no packages (its registry entry has no install step)",
                language.id
            ),
        );
    }
    if config.packages.index_for(&language.id).is_none() {
        let setting = crate::config::PackagesSettings::setting_for(&language.id)
            .map(|s| format!(" (the operator enables them with {s})"))
            .unwrap_or_default();
        return reject(
            "packages",
            format!(
                "packages are not enabled on this server for {}{setting}",
                language.id
            ),
        );
    }
    if packages.len() > MAX_PACKAGES {
        return reject(
            "packages",
            format!(
                "has {} requirements; the maximum is {MAX_PACKAGES}",
                packages.len()
            ),
        );
    }
    for (i, p) in packages.iter().enumerate() {
        let ok = !p.is_empty()
            && p.len() <= 200
            && !p.starts_with('-')
            && p.chars().all(|c| c.is_ascii_graphic())
            && !p.contains("://");
        if !ok {
            return reject(
                format!("packages[{i}]"),
                format!("`{p}` is not a requirement: 1 to 200 printable ASCII characters, no spaces, not starting with `-`, no URL"),
            );
        }
    }
    let mut sorted = packages;
    sorted.sort();
    sorted.dedup();
    Ok(sorted)
}

/// Apply a caller's lower compile-stage limits: each at most the operator's, never above.
fn lower_compile_limits(
    language: &mut Language,
    lower: CompileLimitsInput,
) -> Result<(), RequestError> {
    let l = &mut language.compile_limits;
    if let Some(t) = lower.timeout_seconds {
        if !(t.is_finite() && t >= MIN_TIMEOUT_SECONDS) {
            return reject(
                "compile_limits.timeout_seconds",
                format!("must be at least {MIN_TIMEOUT_SECONDS} s; requested {t}"),
            );
        }
        if t > l.timeout_seconds {
            return reject(
                "compile_limits.timeout_seconds",
                format!(
                    "requested {} s; the compile stage of {} may take at most {} s",
                    fmt_num(t),
                    language.id,
                    fmt_num(l.timeout_seconds)
                ),
            );
        }
        l.timeout_seconds = t;
    }
    if let Some(m) = lower.memory_mb {
        if m < 6 || m > l.memory_mb {
            return reject(
                "compile_limits.memory_mb",
                format!(
                    "requested {m} MB; the compile stage of {} may use 6 to {} MB",
                    language.id, l.memory_mb
                ),
            );
        }
        l.memory_mb = m;
        l.workspace_mb = l.workspace_mb.min(m / 2).max(1);
    }
    Ok(())
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
