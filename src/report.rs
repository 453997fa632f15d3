//! The run report: one shape everywhere (MCP, CLI `--json`, history).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Where a run stands, or how it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Waiting for an admission slot.
    Queued,
    /// Compiling or running.
    Running,
    /// The program exited with status 0.
    Succeeded,
    /// The program exited non-zero or was killed by a signal.
    Failed,
    /// The compile step exited non-zero.
    CompileError,
    /// The wall-clock limit was reached; the program was killed.
    TimedOut,
    /// The memory cgroup killed the program.
    OutOfMemory,
    /// Stopped by `stop_run` or an MCP cancellation.
    Stopped,
    /// codebox or Docker failed; not the program's fault. `message` says what broke.
    SandboxError,
}

impl Status {
    pub const ALL: [Status; 9] = [
        Status::Queued,
        Status::Running,
        Status::Succeeded,
        Status::Failed,
        Status::CompileError,
        Status::TimedOut,
        Status::OutOfMemory,
        Status::Stopped,
        Status::SandboxError,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::CompileError => "compile_error",
            Status::TimedOut => "timed_out",
            Status::OutOfMemory => "out_of_memory",
            Status::Stopped => "stopped",
            Status::SandboxError => "sandbox_error",
        }
    }

    pub fn parse(s: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, Status::Queued | Status::Running)
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stage a terminal status came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// Installing the request's `packages` (SPEC 13).
    Install,
    Compile,
    Run,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Install => "install",
            Stage::Compile => "compile",
            Stage::Run => "run",
        }
    }
}

/// Resources a stage used, measured inside its container when the stage ended: CPU time of
/// every process of the stage, and the memory high-water mark of the container's memory
/// cgroup (the program's memory plus the files it keeps in its working directory, which are
/// memory too). `null` only for a stage that never started, or whose container was killed
/// before it could report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Usage {
    /// CPU time (user + system) of all the stage's processes, in milliseconds.
    pub cpu_time_ms: Option<u64>,
    /// Highest memory use, in KiB.
    pub peak_memory_kb: Option<u64>,
}

/// A file the program left under `outputs/` in its working directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FileReport {
    /// Path relative to the working directory, e.g. `outputs/plot.png`.
    pub path: String,
    pub size_bytes: u64,
    /// Guessed from the content's first bytes, then the extension.
    pub mime_type: String,
    /// SHA-256 of the whole content, lowercase hex (empty for a link or an odd file).
    pub sha256: String,
    /// The content, base64; null when it was left out (see `omitted_reason`).
    pub content_base64: Option<String>,
    /// Why the content is not here (a cap, a symbolic link, not a regular file); null when
    /// it is.
    pub omitted_reason: Option<String>,
}

/// What became of a session's interpreter during an execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InterpreterState {
    /// The execution ran in a fresh interpreter: the session's first, or the first after a
    /// reset (or a `reset: true`).
    New,
    /// The state that was there (variables, imports, definitions) is still there.
    Kept,
    /// The state was lost during this execution; `reset_reason` says why.
    Reset,
}

/// Why a session's interpreter was started again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResetReason {
    TimedOut,
    Stopped,
    OutOfMemory,
    DriverExited,
}

impl ResetReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetReason::TimedOut => "timed_out",
            ResetReason::Stopped => "stopped",
            ResetReason::OutOfMemory => "out_of_memory",
            ResetReason::DriverExited => "driver_exited",
        }
    }
}

/// The session an execution ran in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SessionExecution {
    pub session_id: String,
    /// 1-based; every accepted execution counts (`compile_error` and `stopped` included).
    pub execution_count: u64,
    /// The interpreter after this execution (files-only sessions: `new`, then `kept`).
    pub state: InterpreterState,
    pub reset_reason: Option<ResetReason>,
}

/// The limits a run was given.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunLimits {
    /// Memory limit in MB (swap is disabled: memory+swap equals this).
    pub memory_mb: u64,
    /// Wall-clock limit of the run stage, in seconds.
    pub timeout_seconds: f64,
    /// CPU quota, in cores.
    pub cpus: f64,
}

/// What the compile stage did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompileReport {
    /// `succeeded`, `compile_error`, `timed_out`, `out_of_memory`, `stopped` or `sandbox_error`.
    pub status: Status,
    pub exit_code: Option<i64>,
    pub stdout: String,
    pub stderr: String,
    pub duration_ms: u64,
    pub usage: Usage,
    /// The verdict came from the compile cache: the same inputs compiled before, no compile
    /// container ran (then `duration_ms` is 0 and `usage` null).
    #[serde(default)]
    pub cached: bool,
}

/// One test case of a run with `tests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TestReport {
    pub name: String,
    /// How the program ended for this case (`succeeded`, `failed`, `timed_out`...).
    pub status: Status,
    /// Whether stdout matched `expected_stdout`; null when the case had none.
    pub passed: Option<bool>,
    pub exit_code: Option<i64>,
    pub signal: Option<String>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
    pub usage: Usage,
}

/// Counts of a run with `tests`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TestsSummary {
    /// Cases that passed: stdout matched, or (without `expected_stdout`) the program
    /// succeeded.
    pub passed: u64,
    pub failed: u64,
    pub total: u64,
}

/// The account of one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct RunReport {
    pub run_id: String,
    /// The language id (after alias resolution).
    pub language: String,
    pub status: Status,
    /// Which stage the status comes from: `compile` or `run`; null if no stage started.
    pub stage: Option<Stage>,
    /// Exit code of the run stage (or of the compile stage when it failed).
    pub exit_code: Option<i64>,
    /// Name of the signal that killed the program (e.g. `SIGSEGV`), if one did.
    pub signal: Option<String>,
    /// Standard output (UTF-8; invalid bytes replaced), at most the output cap.
    pub stdout: String,
    pub stderr: String,
    /// True when stdout was longer than the cap and was cut.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Bytes the program wrote to stdout, including any beyond the cap.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The compile stage, for compiled languages; null otherwise or if it never started.
    pub compile: Option<CompileReport>,
    /// Wall time from admission to the end of the run, in milliseconds.
    pub duration_ms: u64,
    /// Time spent waiting for admission, in milliseconds.
    pub queued_ms: u64,
    pub usage: Usage,
    pub limits: RunLimits,
    /// Docker image id the containers were created from.
    pub image_id: Option<String>,
    /// One sentence on what happened.
    pub message: String,
    /// Files the program left under `outputs/`, within the operator's caps; anything over a
    /// cap is listed with its reason.
    #[serde(default)]
    pub files: Vec<FileReport>,
    /// One entry per test case, for a run with `tests`; empty otherwise.
    #[serde(default)]
    pub tests: Vec<TestReport>,
    /// Counts of the test cases; null for a run without `tests`.
    #[serde(default)]
    pub tests_summary: Option<TestsSummary>,
    /// The session this execution ran in; null outside sessions.
    #[serde(default)]
    pub session: Option<SessionExecution>,
    /// In a stateful session, the value of the code's final expression as the language's
    /// REPL echoes it (capped like stdout); null when there is none, or outside sessions.
    #[serde(default)]
    pub result: Option<String>,
    /// True when `result` was longer than the cap and was cut.
    #[serde(default)]
    pub result_truncated: bool,
    /// The request's `packages` and how they were installed; null for a run without any.
    #[serde(default)]
    pub packages: Option<PackagesReport>,
}

/// How a run's requested packages were installed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PackagesReport {
    /// The requirements as requested, sorted.
    pub requested: Vec<String>,
    /// What the package manager installed (dependencies included).
    pub installed: Vec<InstalledPackage>,
    /// True when the prefix came from the cache: nothing was installed, no network reached.
    pub cached: bool,
    /// Time spent installing (0 on a cache hit), in milliseconds.
    pub install_ms: u64,
}

/// One installed package.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InstalledPackage {
    pub name: String,
    pub version: String,
}

impl RunReport {
    /// The bytes its strings hold (output, compile output, message, returned files and test
    /// cases, 128 bytes of bookkeeping each): what keeping it costs, in memory or in a queue.
    pub(super) fn held_bytes(&self) -> u64 {
        const ENTRY: usize = 128;
        let compile = self
            .compile
            .as_ref()
            .map_or(0, |c| c.stdout.len() + c.stderr.len());
        let files: usize = self
            .files
            .iter()
            .map(|f| f.path.len() + f.content_base64.as_ref().map_or(0, String::len) + ENTRY)
            .sum();
        let tests: usize = self
            .tests
            .iter()
            .map(|t| t.name.len() + t.stdout.len() + t.stderr.len() + ENTRY)
            .sum();
        let all = self.stdout.len() + self.stderr.len() + self.message.len() + compile;
        (all + files + tests) as u64
    }

    /// A report with nothing yet to tell: no stage, no output, no usage.
    pub fn new(
        run_id: impl Into<String>,
        language: impl Into<String>,
        status: Status,
        limits: RunLimits,
        message: impl Into<String>,
    ) -> RunReport {
        RunReport {
            run_id: run_id.into(),
            language: language.into(),
            status,
            stage: None,
            exit_code: None,
            signal: None,
            stdout: String::new(),
            stderr: String::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            compile: None,
            duration_ms: 0,
            queued_ms: 0,
            usage: Usage::default(),
            limits,
            image_id: None,
            message: message.into(),
            files: Vec::new(),
            tests: Vec::new(),
            tests_summary: None,
            session: None,
            result: None,
            result_truncated: false,
            packages: None,
        }
    }
}

/// A number for people: `30` rather than `30.0`, `0.5` as is.
pub(super) fn fmt_num(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v}")
    }
}
