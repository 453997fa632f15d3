//! The generic two-stage executor. Compiled languages compile in a container of their own
//! whose working directory (a size-capped tmpfs) is handed back whole; the program then runs
//! in a fresh container whose working directory holds the source, the request's files and
//! those artifacts. Both containers have a read-only root filesystem. Everything travels on
//! the containers' stdin through `codebox-init` (`docs/sandbox-init.md`).
//!
//! A program's failure is an outcome (`Ok` report); only a broken sandbox is a
//! `sandbox_error`, and the report says what broke.
//!
//! The run path reads in one direction: [`Executor::execute`] runs the stage sequence
//! (`stages` below), which gets its containers from [`Containers`] (the pool, the engine, the
//! uid leases and removals), compiles through the [`Compiler`] (and its cache), and runs the
//! program once or once per test case ([`cases`]); what the stages found is an [`Ended`],
//! which becomes the report in one place. A session's execution takes the same path through
//! its [`SessionBox`]; the `Executor` holds the two parts and is the one face callers see.

pub mod cache;
mod cases;
mod compile;
mod containers;
pub mod egress;
pub mod exchange;
pub mod images;
mod labels;
pub mod outcome;
pub mod outputs;
pub mod packages;
pub mod pool;
mod probe;
pub mod session;
pub mod stage;
pub mod timings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::guard::Cleanup;
use crate::engine::posture::PostureViolation;
use crate::engine::protocol::{Collect, Entry, Files, Payload, PhaseName};
use crate::engine::{ContainerEngine, EngineError};
use crate::executor::packages::session::SessionPrefix;
use crate::executor::packages::{InstallEnd, Packages, Prefix};
use crate::report::{
    fmt_num, CompileReport, FileReport, PackagesReport, RunReport, SessionExecution, Stage, Status,
    TestReport,
};
pub use cases::parallelism;
use compile::Compiler;
use containers::Containers;
pub use labels::labels;
use outcome::{classify, Outcome, Streams};
use pool::{Pool, Shape};
pub use probe::ProbeOutput;
use session::{FileRead, ReadError, SessionBox, SessionRun, SessionSpec};
use stage::{Bound, BoundError, Interrupted};
use timings::{Leg, Timings};

/// How long the host waits beyond a stage's own limits before it kills the container
/// (`codebox-init` enforces the limits; this is the backstop).
const BACKSTOP_GRACE: Duration = Duration::from_secs(5);
/// Space a file or directory takes in a tmpfs beyond its content, roughly.
const ENTRY_OVERHEAD_BYTES: u64 = 4096;

/// Why a run could not be carried out: the sandbox's fault, never the program's.
#[derive(Debug, thiserror::Error)]
pub enum SandboxFailure {
    #[error("image {tag} is not present: build it with `codebox images build {image}`")]
    ImageMissing { tag: String, image: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Posture(#[from] PostureViolation),
    /// The run's deadline passed while Docker had not answered a call.
    #[error("{0}")]
    Late(Interrupted),
    #[error("the program's files take {needed_mb} MB, more than its {workspace_mb} MB working directory holds (sandbox.workspace_mb = {setting_mb}, at most half of the run's memory)")]
    WorkspaceTooSmall {
        needed_mb: u64,
        workspace_mb: u64,
        setting_mb: u64,
    },
    #[error("the compile stage handed back a path outside its working directory: {path:?}")]
    ArtifactPath { path: String },
    #[error("the compile stage did not start")]
    CompileNotStarted,
    /// What the container or the engine reported (`codebox-init`'s fatal error, a stream
    /// that broke the protocol, an unexplained end).
    #[error("{0}")]
    Reported(String),
}

/// Why a session's container could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The requested packages did not install (the package manager failed, or hit its time
    /// or memory limit): the request's to fix, not a retry.
    #[error("{0}")]
    Packages(String),
    #[error(transparent)]
    Sandbox(#[from] SandboxFailure),
}

impl From<InstallEnd> for OpenError {
    fn from(end: InstallEnd) -> OpenError {
        if matches!(end, InstallEnd::Failed { .. }) {
            OpenError::Packages(install_failure(end))
        } else {
            OpenError::Sandbox(SandboxFailure::Reported(install_failure(end)))
        }
    }
}

/// Why the stage sequence ended before its end.
enum Halt {
    /// A stop came before the program could run.
    Stopped,
    Failed(SandboxFailure),
}

impl<E: Into<SandboxFailure>> From<E> for Halt {
    fn from(e: E) -> Halt {
        Halt::Failed(e.into())
    }
}

impl From<BoundError> for SandboxFailure {
    fn from(e: BoundError) -> SandboxFailure {
        match e {
            BoundError::Engine(e) => SandboxFailure::Engine(e),
            BoundError::Interrupted(i) => SandboxFailure::Late(i),
        }
    }
}

impl Halt {
    fn bound(e: BoundError) -> Halt {
        match e {
            BoundError::Interrupted(Interrupted::Stopped) => Halt::Stopped,
            other => Halt::Failed(other.into()),
        }
    }
}

/// Runs validated requests on a container engine.
pub struct Executor {
    containers: Containers,
    compiler: Compiler,
    packages: Arc<Packages>,
}

/// A new run id: 32 lowercase hex digits.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

fn mb(n: u64) -> u64 {
    n * 1024 * 1024
}

/// What the stages learnt on the way, whatever ends the run.
#[derive(Default)]
struct Known {
    /// The stage the run last entered.
    stage: Option<Stage>,
    image_id: Option<String>,
    compile: Option<CompileReport>,
    packages: Option<PackagesReport>,
    /// The installed prefix the run's containers mount read-only.
    prefix: Option<Prefix>,
}

/// How the compile stage or the syntax check ended a run.
struct CompileEnd {
    status: Status,
    exit_code: Option<i64>,
    signal: Option<String>,
    message: String,
}

/// How a run ended, before it becomes a report.
enum Ended {
    /// The compile stage or the syntax check ended the run.
    AtCompile(CompileEnd),
    /// The program ran.
    Ran {
        outcome: Outcome,
        streams: Streams,
        files: Vec<FileReport>,
        /// A session's cell: the final expression's value, and whether it was cut.
        result: Option<(String, bool)>,
    },
    /// Every test case ran (or was stopped).
    Cases(Vec<TestReport>),
    /// Stopped before the program ran.
    Stopped,
    Failed(SandboxFailure),
    /// Installing the request's packages failed.
    AtInstall(InstallEnd),
}

impl Executor {
    pub fn new(engine: Arc<dyn ContainerEngine>, config: Arc<Config>, instance: String) -> Self {
        let containers = Containers::new(engine, config, instance);
        let packages = Arc::new(Packages::new(
            containers.config.clone(),
            containers.engine.clone(),
            containers.cleanup.clone(),
            containers.uids.clone(),
            containers.instance.clone(),
        ));
        Executor {
            compiler: Compiler::new(containers.config.cache.compile_mb),
            containers,
            packages,
        }
    }

    /// Packages on request: the install step and its cache.
    pub fn packages(&self) -> &Arc<Packages> {
        &self.packages
    }

    /// Where runs spend their time, phase by phase.
    pub fn timings(&self) -> &Timings {
        &self.containers.timings
    }

    /// The compile cache's hits and misses: (hits, misses).
    pub fn cache_counts(&self) -> (u64, u64) {
        self.compiler.counts()
    }

    /// The containers started ahead of time (empty unless the run manager fills it).
    pub fn pool(&self) -> &Pool {
        &self.containers.pool
    }

    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.containers.engine
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.containers.config
    }

    pub fn instance(&self) -> &str {
        &self.containers.instance
    }

    /// The background removals of this executor's containers.
    pub fn cleanup(&self) -> &Cleanup {
        &self.containers.cleanup
    }

    /// Run `cmd` in a container of `image_tag` with the default limits, outside any run (the
    /// doctor's posture probe, the toolchain checks of `codebox images build`).
    pub async fn probe(
        &self,
        image_tag: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ProbeOutput, SandboxFailure> {
        probe::run(&self.containers, image_tag, cmd, timeout).await
    }

    /// Create, start and open a session's container; the driver (if any) is ready when this
    /// returns.
    /// A session of a language that takes packages gets a packages volume of its own
    /// (`packages::session`), with `spec.packages` installed before it opens.
    pub async fn open_session(&self, spec: SessionSpec<'_>) -> Result<SessionBox, OpenError> {
        let lang = spec.language;
        if !self.packages.takes(lang) {
            return Ok(SessionBox::open(&self.containers, spec, None).await?);
        }
        let prefix = SessionPrefix::create(&self.packages, lang, &spec.name, spec.lifetime).await?;
        if !spec.packages.is_empty() {
            let never = CancellationToken::new();
            let bound = Bound {
                cancel: &never,
                deadline: tokio::time::Instant::now()
                    + Duration::from_secs_f64(
                        self.containers.config.packages.install_timeout_seconds,
                    )
                    + Duration::from_secs(60),
            };
            let image = self
                .containers
                .image(&lang.image.tag, &lang.image.name, bound)
                .await
                .map_err(|h| match h {
                    Halt::Failed(f) => f,
                    Halt::Stopped => SandboxFailure::Reported("stopped".into()),
                })?;
            // Named after the container's name (a prefix of the id only).
            let name = spec.name.trim_start_matches("codebox-").to_string();
            prefix
                .add(
                    &self.packages,
                    &name,
                    lang,
                    &image.id,
                    &spec.packages,
                    bound,
                )
                .await?;
        }
        Ok(SessionBox::open(&self.containers, spec, Some(prefix)).await?)
    }

    /// Carry out one execution of a session. Never fails: the report says what happened, and
    /// [`session::SessionRun::broken`] whether the session's container is gone.
    pub async fn execute_in_session(
        &self,
        sbox: &SessionBox,
        session: SessionExecution,
        run_id: &str,
        req: &ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
    ) -> SessionRun {
        let stages = session::Stages {
            containers: &self.containers,
            compiler: &self.compiler,
            packages: &self.packages,
        };
        sbox.execute(stages, session, run_id, req, queued_ms, cancel)
            .await
    }

    /// Read a file or folder of a session's working directory without running anything.
    pub async fn read_in_session(
        &self,
        sbox: &SessionBox,
        path: &str,
        offset: u64,
        max_bytes: u64,
    ) -> Result<FileRead, ReadError> {
        sbox.read(&self.containers.config, path, offset, max_bytes)
            .await
    }

    /// A report for a run that has not started; the executor fills it in.
    pub fn blank_report(run_id: &str, req: &ValidRequest) -> RunReport {
        RunReport::new(
            run_id,
            req.language.id.clone(),
            Status::Queued,
            req.limits,
            "waiting for a free slot",
        )
    }

    /// The longest a run may take: its check or compile stage's limit, then its program's.
    pub fn budget(req: &ValidRequest) -> Duration {
        let lang = &req.language;
        let before = if lang.can_fail_to_compile() {
            lang.compile_limits.timeout_seconds
        } else {
            0.0
        };
        Duration::from_secs_f64(before + req.limits.timeout_seconds)
    }

    /// [`Executor::budget`] plus the install step's limit when the run asks for packages.
    pub(super) fn budget_with_install(config: &Config, req: &ValidRequest) -> Duration {
        let install = if req.packages.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(config.packages.install_timeout_seconds)
                + BACKSTOP_GRACE
                + Duration::from_secs(30)
        };
        Executor::budget(req) + install
    }

    /// Carry out one run. Never fails: a broken sandbox is reported as `sandbox_error`.
    /// Containers are removed in the background once the report is made (see [`Cleanup`]),
    /// or, if the future is dropped, right after. Every engine call ends at a stop or at the
    /// run's deadline (its limits and a grace), whichever comes first.
    pub async fn execute(
        &self,
        run_id: &str,
        req: &ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
    ) -> RunReport {
        let started = Instant::now();
        let bound = Bound {
            cancel: &cancel,
            deadline: tokio::time::Instant::now()
                + Executor::budget_with_install(&self.containers.config, req)
                + BACKSTOP_GRACE,
        };
        let mut known = Known::default();
        let ended = match self.stages(run_id, req, &mut known, bound).await {
            Ok(ended) => ended,
            Err(Halt::Stopped) => Ended::Stopped,
            Err(Halt::Failed(f)) => Ended::Failed(f),
        };
        let mut report = Executor::report(run_id, req, known, ended);
        report.queued_ms = queued_ms;
        report.duration_ms = ms(started.elapsed());
        report
    }

    /// The report of a run, built once from what its stages found.
    fn report(run_id: &str, req: &ValidRequest, known: Known, ended: Ended) -> RunReport {
        let mut r = RunReport::new(
            run_id,
            req.language.id.clone(),
            Status::Running,
            req.limits,
            "",
        );
        r.stage = known.stage;
        r.image_id = known.image_id;
        r.compile = known.compile;
        r.packages = known.packages;
        match ended {
            Ended::AtInstall(InstallEnd::Failed {
                status,
                message,
                exit_code,
                stdout,
                stderr,
                usage,
                install_ms,
            }) => {
                r.stage = Some(Stage::Install);
                r.status = status;
                r.message = message;
                r.exit_code = exit_code;
                r.stdout_bytes = stdout.len() as u64;
                r.stderr_bytes = stderr.len() as u64;
                r.stdout = stdout;
                r.stderr = stderr;
                r.usage = usage;
                r.packages = Some(PackagesReport {
                    requested: req.packages.clone(),
                    installed: Vec::new(),
                    cached: false,
                    install_ms,
                });
            }
            Ended::AtInstall(InstallEnd::Stopped) => {
                r.stage = Some(Stage::Install);
                r.status = Status::Stopped;
                r.message = "stopped while the packages were being installed".into();
            }
            Ended::AtInstall(InstallEnd::Sandbox(m)) => {
                r.stage = Some(Stage::Install);
                r.status = Status::SandboxError;
                r.message = format!("installing the packages failed: {m}");
            }
            Ended::AtCompile(c) => {
                r.stage = Some(Stage::Compile);
                r.status = c.status;
                r.exit_code = c.exit_code;
                r.signal = c.signal;
                r.message = c.message;
            }
            Ended::Ran {
                outcome,
                streams,
                files,
                result,
            } => {
                if let Some((text, truncated)) = result {
                    r.result = Some(text);
                    r.result_truncated = truncated;
                }
                r.message = outputs::with_unlisted_note(run_message(&outcome, req), &files);
                r.status = outcome.status;
                r.exit_code = outcome.exit_code;
                r.signal = outcome.signal;
                r.usage = outcome.usage;
                r.stdout_truncated = streams.stdout_truncated();
                r.stderr_truncated = streams.stderr_truncated();
                r.stdout = streams.stdout;
                r.stderr = streams.stderr;
                r.stdout_bytes = streams.stdout_bytes;
                r.stderr_bytes = streams.stderr_bytes;
                r.files = files;
            }
            Ended::Cases(cases) => cases::summarise(&mut r, cases),
            Ended::Stopped => {
                r.status = Status::Stopped;
                r.message = "stopped before the program ran".into();
            }
            Ended::Failed(f) => {
                r.status = Status::SandboxError;
                r.message = f.to_string();
            }
        }
        r
    }

    /// The source and the request's files, as working-directory entries.
    fn sources(req: &ValidRequest) -> Vec<Entry> {
        let mut entries = vec![Entry::file(
            req.language.source_file.clone(),
            0o644,
            Bytes::from(req.code.clone().into_bytes()),
        )];
        entries.extend(
            req.files
                .iter()
                .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone())),
        );
        entries
    }

    /// The stage sequence: compile (while the run's container is prepared), then the program
    /// once, or once per test case.
    async fn stages(
        &self,
        run_id: &str,
        req: &ValidRequest,
        known: &mut Known,
        bound: Bound<'_>,
    ) -> Result<Ended, Halt> {
        let containers = &self.containers;
        // With packages, the program's environment gains the prefix's variables.
        let with_prefix;
        let req = if req.packages.is_empty() {
            req
        } else {
            if let Err(end) = self.install_packages(run_id, req, known, bound).await? {
                return Ok(Ended::AtInstall(end));
            }
            let mut r = req.clone();
            if let Some(p) = &known.prefix {
                r.language.env.extend(p.env.clone());
            }
            with_prefix = r;
            &with_prefix
        };
        let lang = &req.language;
        let first_want = containers.run_want(
            run_id,
            req,
            if req.tests.is_empty() { "run" } else { "t1" },
            known.prefix.as_ref(),
        );
        // The pool learns that runs mount this prefix: it may keep containers ready with it.
        let _asked = known.prefix.as_ref().map(|p| {
            let shape = Shape::new(&lang.image.tag, first_want.limits, first_want.workspace_mb)
                .with_packages(first_want.prefix.clone());
            let n = if req.tests.is_empty() {
                1
            } else {
                parallelism(req, &containers.config)
            };
            containers.pool.asked_with_prefix(lang, &shape, n, p);
            pool::Asked::new(containers.pool.clone(), vec![(shape, n)])
        });
        let prepare_run = containers.acquire(&first_want, bound);
        let (files, first) = if lang.is_compiled() {
            let compile = async {
                let began = Instant::now();
                let compiled = self
                    .compiler
                    .compile_cached(containers, run_id, req, known, bound)
                    .await;
                containers.timings.record(Leg::Compile, began.elapsed());
                compiled
            };
            let (compiled, first) = tokio::join!(compile, prepare_run);
            let stop_here = match compiled {
                Ok(Ok(files)) => Ok(files),
                Ok(Err(end)) => Err(Ok(Ended::AtCompile(end))),
                Err(halt) => Err(Err(halt)),
            };
            match stop_here {
                Ok(files) => (files, first?),
                Err(ended) => {
                    if let Ok(c) = first {
                        c.guard.remove_later();
                    }
                    return ended;
                }
            }
        } else {
            (Files::new(&Executor::sources(req)), prepare_run.await?)
        };
        if bound.cancel.is_cancelled() {
            first.guard.remove_later();
            return Ok(Ended::Stopped);
        }
        let workspace_mb = first_want.workspace_mb;
        let needed = files.content_bytes() + files.len() as u64 * ENTRY_OVERHEAD_BYTES;
        if needed > mb(workspace_mb) {
            first.guard.remove_later();
            return Err(SandboxFailure::WorkspaceTooSmall {
                needed_mb: needed.div_ceil(mb(1)),
                workspace_mb,
                setting_mb: containers.config.sandbox.workspace_mb,
            }
            .into());
        }
        known.stage = Some(Stage::Run);
        let program = Program {
            check_in_run: first.image.check_in_run,
            files,
            check_budget: if lang.check.is_some() {
                Duration::from_secs_f64(lang.compile_limits.timeout_seconds)
            } else {
                Duration::ZERO
            },
            timeout: Duration::from_secs_f64(req.limits.timeout_seconds),
        };
        if !req.tests.is_empty() {
            return cases::run(containers, run_id, req, &program, first, known, bound).await;
        }
        let s = &containers.config.sandbox;
        let outputs = Collect::Outputs {
            max_files: s.max_output_files,
            max_bytes: s.max_output_bytes,
            max_file_bytes: s.max_output_file_bytes,
        };
        let payload = program.payload(
            req,
            &containers.config,
            &req.args,
            req.stdin.clone(),
            true,
            outputs,
        );
        let result = containers
            .run_in(
                &first_want,
                first,
                payload,
                program.limit(),
                s.max_output_bytes,
                bound,
            )
            .await?;
        known.image_id = known.image_id.take().or(result.image_id.clone());
        if let Some(end) = compile::check_failed(&result, lang, known, req.limits.memory_mb) {
            return Ok(Ended::AtCompile(end));
        }
        let phase = result.decoded.phase(PhaseName::Run);
        Ok(Ended::Ran {
            outcome: classify(phase, &result),
            streams: Streams::of(phase),
            files: outputs::report_files(&result.decoded.files),
            result: None,
        })
    }
}

impl Executor {
    /// Install the request's packages (or take them from the cache) before any stage: the
    /// run's containers then mount the prefix read-only (`known.prefix`).
    async fn install_packages(
        &self,
        run_id: &str,
        req: &ValidRequest,
        known: &mut Known,
        bound: Bound<'_>,
    ) -> Result<Result<(), InstallEnd>, Halt> {
        let lang = &req.language;
        let image = self
            .containers
            .image(&lang.image.tag, &lang.image.name, bound)
            .await?;
        known.stage = Some(Stage::Install);
        match self
            .packages
            .prepare(run_id, lang, &image.id, &req.packages, bound)
            .await
        {
            Ok((prefix, report)) => {
                known.packages = Some(report);
                known.prefix = Some(prefix);
                Ok(Ok(()))
            }
            Err(end) => Ok(Err(end)),
        }
    }
}

/// What a session is told when installing its packages at creation failed: the message and
/// the end of the package manager's output.
fn install_failure(end: InstallEnd) -> String {
    match end {
        InstallEnd::Failed {
            message, stderr, ..
        } => {
            let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            if tail.is_empty() {
                message
            } else {
                format!("{message}; it ended with: {}", tail.join(" / "))
            }
        }
        InstallEnd::Stopped => "stopped while installing the packages".into(),
        InstallEnd::Sandbox(m) => format!("installing the packages failed: {m}"),
    }
}

/// What the run stage lays out and how long it may take, shared by every test case.
struct Program {
    /// The image's `codebox-init` can check in the program's own process.
    check_in_run: bool,
    files: Files,
    /// The syntax check's limit (zero without one).
    check_budget: Duration,
    timeout: Duration,
}

impl Program {
    /// The check's and the program's limits together.
    fn limit(&self) -> Duration {
        self.check_budget + self.timeout
    }

    fn payload(
        &self,
        req: &ValidRequest,
        config: &Config,
        args: &[String],
        stdin: Option<Bytes>,
        check: bool,
        collect: Collect,
    ) -> Payload {
        let lang = &req.language;
        let check = check && lang.check.is_some();
        // One interpreter start where the language can check in the program's process.
        let (check_cmd, mut run, check_in_run) = match (&lang.checked_run, check) {
            (Some(both), true) if self.check_in_run => (None, both.clone(), true),
            _ => (
                lang.check.clone().filter(|_| check),
                lang.run.clone(),
                false,
            ),
        };
        run.extend(args.iter().cloned());
        Payload {
            env: lang.env.clone(),
            check: check_cmd,
            run: Some(run),
            check_in_run,
            check_timeout: self.check_budget,
            timeout: self.timeout,
            output_limit: config.sandbox.output_limit_bytes,
            collect: Some(collect),
            files: self.files.clone(),
            stdin,
        }
    }
}

/// One sentence on how a program ended.
fn run_message(o: &Outcome, req: &ValidRequest) -> String {
    match (o.status, &o.problem) {
        (Status::SandboxError, Some(problem)) => problem.clone(),
        (Status::Succeeded, _) => "exited with code 0".to_string(),
        (Status::Stopped, _) => "stopped before it finished".to_string(),
        (Status::TimedOut, _) => format!(
            "killed at the {} s wall-clock limit",
            fmt_num(req.limits.timeout_seconds)
        ),
        (Status::OutOfMemory, _) => format!(
            "killed by the out-of-memory killer at the {} MB memory limit",
            req.limits.memory_mb
        ),
        _ => match (&o.signal, o.exit_code) {
            (Some(sig), _) => format!("killed by {sig}"),
            (None, Some(code)) => format!("exited with code {code}"),
            (None, None) => "ended without an exit code".to_string(),
        },
    }
}
