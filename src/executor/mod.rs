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
//! (`stages` below), which gets its containers from [`Containers`] (the pool, else the one
//! container factory, `factory.rs`, which makes the pool's and the install step's too: uid
//! lease, spec, posture check, guard, create), compiles through the [`Compiler`] (and its
//! cache), and runs the program once or once per test case ([`cases`]); what the stages
//! found is an [`Ended`], which becomes the report in one place (`finish.rs`). A session's
//! execution takes the same path through its [`SessionBox`]; the `Executor` holds the two
//! parts and is the one face callers see. The face stands on top: the words its children share (`Halt`, `Known`,
//! `Ended`, the grace and the budgets) live in the leaf `ends.rs`, the run stage's layout in
//! `program.rs`, and no child imports this file.

pub mod cache;
mod cases;
mod compile;
mod containers;
pub mod egress;
mod ends;
pub mod exchange;
mod factory;
mod finish;
pub mod images;
mod labels;
pub mod outcome;
pub mod outputs;
pub mod packages;
pub mod pool;
mod probe;
mod program;
pub mod session;
pub mod stage;
pub mod timings;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::guard::Cleanup;
use crate::engine::protocol::{Collect, Files, PhaseName};
use crate::engine::ContainerEngine;
use crate::executor::packages::session::SessionPrefix;
use crate::executor::packages::{InstallEnd, Packages};
use crate::report::{RunReport, SessionExecution, Stage, Status};
pub(crate) use cases::parallelism;
use compile::Compiler;
use containers::Containers;
use ends::{mb, ms, Ended, Halt, Known, ENTRY_OVERHEAD_BYTES};
pub use ends::{new_run_id, Call, SandboxFailure};
pub use labels::labels;
use outcome::{classify, Streams};
use pool::{Pool, Shape};
pub(crate) use probe::ProbeOutput;
use program::Program;
use session::{FileRead, ReadError, SessionBox, SessionRun, SessionSpec};
use stage::Bound;
use timings::{Leg, Timings};

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
            OpenError::Sandbox(SandboxFailure::Install(install_failure(end)))
        }
    }
}

/// Runs validated requests on a container engine.
pub struct Executor {
    containers: Containers,
    compiler: Compiler,
    packages: Arc<Packages>,
}

impl Executor {
    pub fn new(engine: Arc<dyn ContainerEngine>, config: Arc<Config>, instance: String) -> Self {
        let containers = Containers::new(engine, config, instance);
        let packages = Arc::new(Packages::new(
            containers.factory.clone(),
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
    pub(crate) fn cache_counts(&self) -> (u64, u64) {
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
            let bound = Bound::new(
                &never,
                tokio::time::Instant::now()
                    + Duration::from_secs_f64(
                        self.containers.config.packages.install_timeout_seconds,
                    )
                    + Duration::from_secs(60),
            );
            let image = self
                .containers
                .image(&lang.image.tag, &lang.image.name, bound)
                .await
                .map_err(|h| match h {
                    Halt::Failed(f) => f,
                    Halt::Stopped => SandboxFailure::Stopped,
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
    pub(crate) async fn execute_in_session(
        &self,
        sbox: &SessionBox,
        session: SessionExecution,
        call: Call<'_>,
    ) -> SessionRun {
        let stages = session::Stages {
            containers: &self.containers,
            compiler: &self.compiler,
            packages: &self.packages,
        };
        sbox.execute(stages, session, call).await
    }

    /// Read a file or folder of a session's working directory without running anything.
    pub(crate) async fn read_in_session(
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
    pub(crate) fn blank_report(run_id: &str, req: &ValidRequest) -> RunReport {
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
        ends::budget(req)
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
        let call = Call {
            run_id,
            req,
            queued_ms,
            cancel,
            feed: None,
        };
        self.execute_live(call).await
    }

    /// [`Executor::execute`], shown as it goes in `feed`.
    pub(crate) async fn execute_live(&self, call: Call<'_>) -> RunReport {
        let started = Instant::now();
        let (run_id, req, queued_ms) = (call.run_id, call.req, call.queued_ms);
        let bound = call.bound(&self.containers.config);
        let mut known = Known::default();
        let ended = match self.stages(run_id, req, &mut known, bound).await {
            Ok(ended) => ended,
            Err(Halt::Stopped) => Ended::Stopped,
            Err(Halt::Failed(f)) => Ended::Failed(f),
        };
        let mut report = finish::report(run_id, req, known, ended);
        report.queued_ms = queued_ms;
        report.duration_ms = ms(started.elapsed());
        report
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
            (Files::new(&ends::sources(req)), prepare_run.await?)
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
