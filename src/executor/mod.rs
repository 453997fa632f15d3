//! The generic two-stage executor. Compiled languages compile in a container of their own
//! whose working directory (a size-capped tmpfs) is handed back whole; the program then runs
//! in a fresh container whose working directory holds the source, the request's files and
//! those artifacts. Both containers have a read-only root filesystem. Everything travels on
//! the containers' stdin through `codebox-init` (`docs/sandbox-init.md`).
//!
//! A program's failure is an outcome (`Ok` report); only a broken sandbox is a
//! `sandbox_error`, and the report says what broke.

pub mod cache;
pub mod outcome;
pub mod outputs;
pub mod pool;
pub mod request;
pub mod stage;
pub mod timings;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::guard::{Cleanup, ContainerGuard};
use crate::engine::posture::{self, Limits, Plan, PostureViolation};
use crate::engine::protocol::{self, Collect, DecodeLimits, Entry, EntryKind, Payload, PhaseName};
use crate::engine::uids::UidPool;
use crate::engine::{
    ContainerEngine, EngineError, LABEL_EXPIRES, LABEL_INSTANCE, LABEL_MANAGED, LABEL_RUN,
};
use crate::registry::Language;
use crate::report::{
    fmt_num, CompileReport, RunReport, Stage, Status, TestReport, TestsSummary, Usage,
};
use cache::{CompileCache, Verdict};
use futures_util::StreamExt;
use outcome::{classify, Outcome};
use pool::{run_workspace_mb, Pool, Shape};
pub use request::{
    Compare, CompileLimitsInput, Encoding, FileInput, LimitsInput, RequestError, RunRequest,
    TestInput, ValidRequest, ValidTest,
};
use stage::{run_stage, StageRequest, StageResult};
use timings::{Phase as TimedPhase, Timings};

/// Extra time before a container counts as abandoned, beyond its limits.
const EXPIRY_MARGIN: Duration = Duration::from_secs(600);
/// How long the host waits beyond a stage's own limits before it kills the container
/// (`codebox-init` enforces the limits; this is the backstop).
const BACKSTOP_GRACE: Duration = Duration::from_secs(5);
/// Most entries a compile stage may hand back.
const MAX_ARTIFACT_ENTRIES: usize = 10_000;
/// Most entries listed from `outputs/` (`codebox-init` lists at most 1000).
const MAX_OUTPUT_ENTRIES: usize = 1024;
/// Space a file or directory takes in a tmpfs beyond its content, roughly.
const ENTRY_OVERHEAD_BYTES: u64 = 4096;

/// Why a run could not be carried out.
#[derive(Debug, thiserror::Error)]
enum SandboxFailure {
    #[error("image {tag} is not present: build it with `codebox images build {image}`")]
    ImageMissing { tag: String, image: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Posture(#[from] PostureViolation),
    #[error("{0}")]
    Sandbox(String),
}

/// What a probe container printed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i64>,
}

/// Runs validated requests on a container engine.
pub struct Executor {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    instance: String,
    uids: Arc<UidPool>,
    cleanup: Cleanup,
    pool: Pool,
    timings: Arc<Timings>,
    cache: CompileCache,
}

/// The container a stage needs.
struct Want {
    /// Its name, should it be created for the run.
    name: String,
    image_tag: String,
    /// The registry name of its image (for `codebox images build NAME`).
    image_name: String,
    limits: Limits,
    workspace_mb: u64,
    labels: BTreeMap<String, String>,
}

/// A container for one stage: created only, or started ahead of time (taken from the pool).
struct Acquired {
    guard: ContainerGuard,
    started: bool,
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

/// The stage's output as text, and what the report says about its size.
struct Streams {
    stdout: String,
    stderr: String,
    stdout_bytes: u64,
    stderr_bytes: u64,
}

fn streams(phase: Option<&protocol::Phase>) -> Streams {
    let Some(p) = phase else {
        return Streams {
            stdout: String::new(),
            stderr: String::new(),
            stdout_bytes: 0,
            stderr_bytes: 0,
        };
    };
    let (out, err) = p
        .end
        .as_ref()
        .map_or((0, 0), |e| (e.stdout_bytes, e.stderr_bytes));
    Streams {
        stdout: String::from_utf8_lossy(&p.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&p.stderr).into_owned(),
        stdout_bytes: out.max(p.stdout.len() as u64),
        stderr_bytes: err.max(p.stderr.len() as u64),
    }
}

/// A path a container handed back is usable only if it stays inside the working directory.
fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
}

impl Executor {
    pub fn new(engine: Arc<dyn ContainerEngine>, config: Arc<Config>, instance: String) -> Self {
        let uids = UidPool::new(&config.data_dir);
        let timings = Arc::new(Timings::default());
        let cleanup = {
            let timings = timings.clone();
            Cleanup::observed(Arc::new(move |d| timings.record(TimedPhase::Remove, d)))
        };
        let pool = Pool::new(
            engine.clone(),
            config.clone(),
            instance.clone(),
            uids.clone(),
            cleanup.clone(),
        );
        Executor {
            cache: CompileCache::new(config.cache.compile_mb),
            engine,
            config,
            instance,
            uids,
            cleanup,
            pool,
            timings,
        }
    }

    /// The compile cache.
    pub fn cache(&self) -> &CompileCache {
        &self.cache
    }

    /// Where runs spend their time, phase by phase.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// The containers started ahead of time (empty unless the run manager fills it).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.engine
    }

    pub fn config(&self) -> &Arc<Config> {
        &self.config
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// The background removals of this executor's containers.
    pub fn cleanup(&self) -> &Cleanup {
        &self.cleanup
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

    /// Carry out one run. Never fails: a broken sandbox is reported as `sandbox_error`.
    /// Containers are removed in the background once the report is made (see [`Cleanup`]),
    /// or, if the future is dropped, right after.
    pub async fn execute(
        &self,
        run_id: &str,
        req: &ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
    ) -> RunReport {
        let started = Instant::now();
        let mut report = Executor::blank_report(run_id, req);
        report.status = Status::Running;
        report.queued_ms = queued_ms;
        if let Err(e) = self.stages(run_id, req, &mut report, &cancel).await {
            report.status = Status::SandboxError;
            report.message = e.to_string();
        }
        report.duration_ms = ms(started.elapsed());
        report
    }

    /// Run one command in a locked-down container with an empty working directory (the
    /// `doctor` posture probe, toolchain version checks), with the default limits.
    pub async fn probe(
        &self,
        image_tag: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ProbeOutput, String> {
        let run_id = new_run_id();
        let mut labels = self.labels(&run_id, timeout);
        labels.insert("codebox.probe".into(), "true".into());
        let limits = Limits {
            memory_mb: self.config.limits.default_memory_mb,
            cpus: self.config.limits.default_cpus,
        };
        let payload = Payload {
            run: Some(cmd),
            timeout,
            output_limit: self.config.sandbox.output_limit_bytes,
            collect: Some(Collect::None),
            ..Default::default()
        };
        let result = async {
            let want = Want {
                name: format!("codebox-{run_id}-probe"),
                image_tag: image_tag.to_string(),
                image_name: image_tag.to_string(),
                limits,
                workspace_mb: self.config.sandbox.workspace_mb,
                labels,
            };
            let container = self.launch(&want).await?;
            self.stage(
                &want,
                container,
                payload,
                timeout,
                0,
                &CancellationToken::new(),
            )
            .await
        }
        .await
        .map_err(|e| e.to_string())?;
        let phase = result.decoded.phase(PhaseName::Run);
        let o = classify(phase, &result);
        if let Some(problem) = o.problem {
            return Err(problem);
        }
        let s = streams(phase);
        Ok(ProbeOutput {
            stdout: s.stdout,
            stderr: s.stderr,
            exit_code: o.exit_code,
        })
    }

    fn labels(&self, run_id: &str, budget: Duration) -> BTreeMap<String, String> {
        let expires = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + budget
            + EXPIRY_MARGIN;
        BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_RUN.to_string(), run_id.to_string()),
            (LABEL_INSTANCE.to_string(), self.instance.clone()),
            (LABEL_EXPIRES.to_string(), expires.as_secs().to_string()),
        ])
    }

    /// Create one locked-down container (not started): lease a uid, build the spec, check
    /// it, and hand back its owner.
    async fn launch(&self, want: &Want) -> Result<Acquired, SandboxFailure> {
        let lease = self.uids.lease();
        let plan = Plan {
            name: want.name.clone(),
            image: want.image_tag.clone(),
            uid: lease.uid,
            limits: want.limits,
            workspace_mb: want.workspace_mb,
            labels: want.labels.clone(),
        };
        let spec = posture::locked_down(&plan, &self.config.sandbox);
        posture::check(&spec, &self.config.sandbox)?;
        let guard = ContainerGuard::new(
            self.engine.clone(),
            self.cleanup.clone(),
            want.name.clone(),
            lease,
        );
        match self.engine.create_container(&spec).await {
            Ok(_) => Ok(Acquired {
                guard,
                started: false,
            }),
            Err(EngineError::ImageMissing { tag }) => Err(SandboxFailure::ImageMissing {
                tag,
                image: want.image_name.clone(),
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// A container for a stage: a ready one from the pool, else a new one (created only).
    async fn acquire(&self, want: &Want) -> Result<Acquired, SandboxFailure> {
        let began = Instant::now();
        let shape = Shape::new(&want.image_tag, want.limits, want.workspace_mb);
        let acquired = match self.pool.take(&shape).await {
            Some(taken) => Ok(Acquired {
                guard: taken.guard,
                started: true,
            }),
            None => self.launch(want).await,
        };
        self.timings.record(TimedPhase::Acquire, began.elapsed());
        acquired
    }

    /// Run a payload in `container`, then hand it to removal. A container taken from the pool
    /// that turns out dead (it never answered) is replaced by a new one, once: nothing of the
    /// run had started in it.
    async fn stage(
        &self,
        want: &Want,
        container: Acquired,
        payload: Payload,
        limits_total: Duration,
        content_bytes: u64,
        cancel: &CancellationToken,
    ) -> Result<StageResult, SandboxFailure> {
        let entries = match payload.collect {
            Some(Collect::WorkspaceOnSuccess { .. }) => MAX_ARTIFACT_ENTRIES,
            _ => MAX_OUTPUT_ENTRIES,
        };
        let request = StageRequest {
            payload: Bytes::from(payload.encode()),
            backstop: limits_total + BACKSTOP_GRACE,
            run_backstop: payload
                .check
                .as_ref()
                .map(|_| payload.timeout + BACKSTOP_GRACE),
            limits: DecodeLimits {
                output: self.config.sandbox.output_limit_bytes,
                content: content_bytes,
                entries,
            },
        };
        let mut container = container;
        loop {
            let result = run_stage(
                self.engine.as_ref(),
                container.guard.name(),
                !container.started,
                request.clone(),
                cancel,
            )
            .await;
            let dead_on_arrival = container.started
                && !cancel.is_cancelled()
                && match &result {
                    Err(EngineError::Attach(_)) => true,
                    Ok(r) => {
                        r.decoded.phases.is_empty()
                            && !r.decoded.complete
                            && r.decoded.fatal.is_none()
                            && r.protocol_error.is_none()
                    }
                    Err(_) => false,
                };
            container.guard.remove_later();
            if let Ok(r) = &result {
                let t = &r.times;
                self.timings.record(TimedPhase::Deliver, t.deliver);
                self.timings.record(TimedPhase::Run, t.run);
                self.timings.record(TimedPhase::Collect, t.collect);
            }
            if !dead_on_arrival {
                return Ok(result?);
            }
            tracing::warn!("a container started ahead of time never answered; using a new one");
            self.pool
                .counters()
                .failed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            container = self.launch(want).await?;
        }
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

    /// The memory and size of a run's own container.
    fn run_limits(&self, req: &ValidRequest) -> (Limits, u64) {
        let memory_mb = req.limits.memory_mb;
        let workspace_mb = run_workspace_mb(&self.config, memory_mb);
        (
            Limits {
                memory_mb,
                cpus: req.limits.cpus,
            },
            workspace_mb,
        )
    }

    async fn stages(
        &self,
        run_id: &str,
        req: &ValidRequest,
        report: &mut RunReport,
        cancel: &CancellationToken,
    ) -> Result<(), SandboxFailure> {
        let lang = &req.language;
        let check_budget = if lang.check.is_some() {
            Duration::from_secs_f64(lang.compile_limits.timeout_seconds)
        } else {
            Duration::ZERO
        };
        let run_timeout = Duration::from_secs_f64(req.limits.timeout_seconds);
        let (run_limits, run_workspace_mb) = self.run_limits(req);
        let run_want = |suffix: &str| Want {
            name: format!("codebox-{run_id}-{suffix}"),
            image_tag: lang.image.tag.clone(),
            image_name: lang.image.name.clone(),
            limits: run_limits,
            workspace_mb: run_workspace_mb,
            labels: self.labels(run_id, check_budget + run_timeout),
        };
        let first_want = run_want(if req.tests.is_empty() { "run" } else { "t1" });
        let prepare_run = self.acquire(&first_want);
        // Compile while the run's container is being created.
        let (entries, first) = if lang.is_compiled() {
            let compile = async {
                let began = Instant::now();
                let compiled = self.compile_cached(run_id, req, report, cancel).await;
                self.timings.record(TimedPhase::Compile, began.elapsed());
                compiled
            };
            let (compiled, first) = tokio::join!(compile, prepare_run);
            match compiled? {
                Some(artifacts) => (artifacts, first?),
                None => {
                    if let Ok(c) = first {
                        c.guard.remove_later();
                    }
                    return Ok(());
                }
            }
        } else {
            (Executor::sources(req), prepare_run.await?)
        };
        if cancel.is_cancelled() {
            first.guard.remove_later();
            report.status = Status::Stopped;
            report.message = "stopped before the program ran".into();
            return Ok(());
        }
        let needed: u64 = entries
            .iter()
            .map(|e| e.content.len() as u64 + ENTRY_OVERHEAD_BYTES)
            .sum();
        if needed > mb(run_workspace_mb) {
            first.guard.remove_later();
            return Err(SandboxFailure::Sandbox(format!(
                "the program's files take {} MB, more than its {run_workspace_mb} MB working directory holds (sandbox.workspace_mb = {}, at most half of the run's memory)",
                needed.div_ceil(mb(1)),
                self.config.sandbox.workspace_mb
            )));
        }
        report.stage = Some(Stage::Run);
        let s = &self.config.sandbox;
        let payload = |args: &[String], stdin: Option<Bytes>, check: bool, collect: Collect| {
            let mut run = lang.run.clone();
            run.extend(args.iter().cloned());
            Payload {
                env: lang.env.clone(),
                check: lang.check.clone().filter(|_| check),
                run: Some(run),
                check_timeout: check_budget,
                timeout: run_timeout,
                output_limit: s.output_limit_bytes,
                collect: Some(collect),
                entries: entries.clone(),
                stdin,
            }
        };
        let limit = check_budget + run_timeout;
        if req.tests.is_empty() {
            let outputs = Collect::Outputs {
                max_files: s.max_output_files,
                max_bytes: s.max_output_bytes,
                max_file_bytes: s.max_output_file_bytes,
            };
            let result = self
                .stage(
                    &first_want,
                    first,
                    payload(&req.args, req.stdin.clone(), true, outputs),
                    limit,
                    s.max_output_bytes,
                    cancel,
                )
                .await?;
            report.image_id = report.image_id.take().or(result.image_id.clone());
            if !self.record_check(report, &result, lang) {
                return Ok(());
            }
            let phase = result.decoded.phase(PhaseName::Run);
            let o = classify(phase, &result);
            let st = streams(phase);
            report.stdout_truncated = st.stdout_bytes > st.stdout.len() as u64;
            report.stderr_truncated = st.stderr_bytes > st.stderr.len() as u64;
            report.stdout = st.stdout;
            report.stderr = st.stderr;
            report.stdout_bytes = st.stdout_bytes;
            report.stderr_bytes = st.stderr_bytes;
            report.files = outputs::report_files(&result.decoded.files);
            report.message = run_message(&o, req);
            report.status = o.status;
            report.exit_code = o.exit_code;
            report.signal = o.signal;
            report.usage = o.usage;
            return Ok(());
        }
        // Test cases: the first runs the check (if the language has one) alone; then every
        // other case runs in a fresh container of its own, several at once.
        let case = |i: usize, container: Option<Acquired>, check: bool| {
            let t = &req.tests[i];
            let want = run_want(&format!("t{}", i + 1));
            let p = payload(&t.args, t.stdin.clone(), check, Collect::None);
            async move {
                let container = match container {
                    Some(c) => c,
                    None => self.acquire(&want).await?,
                };
                self.stage(&want, container, p, limit, 0, cancel).await
            }
        };
        let first_result = case(0, Some(first), true).await?;
        report.image_id = report.image_id.take().or(first_result.image_id.clone());
        if !self.record_check(report, &first_result, lang) {
            return Ok(());
        }
        let parallel = parallelism(req, &self.config);
        let rest: Vec<Result<StageResult, SandboxFailure>> =
            futures_util::stream::iter(1..req.tests.len())
                .map(|i| case(i, None, false))
                .buffered(parallel)
                .collect()
                .await;
        let mut results = vec![Ok(first_result)];
        results.extend(rest);
        self.finish_tests(report, req, results);
        Ok(())
    }

    /// Record a check phase in the report; `false` when it failed and the run ends here.
    fn record_check(&self, report: &mut RunReport, result: &StageResult, lang: &Language) -> bool {
        let Some(check) = result.decoded.phase(PhaseName::Check) else {
            return true;
        };
        let o = classify(Some(check), result);
        if o.status != Status::Succeeded {
            self.finish_compile(report, o, check, result, lang, false);
            return false;
        }
        report.compile = Some(compile_report(Status::Succeeded, check, result, o.usage));
        true
    }

    /// Fill a report from its test cases' results.
    fn finish_tests(
        &self,
        report: &mut RunReport,
        req: &ValidRequest,
        results: Vec<Result<StageResult, SandboxFailure>>,
    ) {
        let mut cases = Vec::with_capacity(results.len());
        for (t, result) in req.tests.iter().zip(results) {
            let case = match result {
                Ok(result) => {
                    let phase = result.decoded.phase(PhaseName::Run);
                    let o = classify(phase, &result);
                    let st = streams(phase);
                    TestReport {
                        name: t.name.clone(),
                        passed: t.expected_stdout.as_deref().map(|e| {
                            o.status == Status::Succeeded && req.compare.matches(e, &st.stdout)
                        }),
                        status: o.status,
                        exit_code: o.exit_code,
                        signal: o.signal,
                        stdout_truncated: st.stdout_bytes > st.stdout.len() as u64,
                        stderr_truncated: st.stderr_bytes > st.stderr.len() as u64,
                        stdout: st.stdout,
                        stderr: match o.problem {
                            Some(problem) => problem,
                            None => st.stderr,
                        },
                        duration_ms: phase
                            .and_then(|p| p.end.as_ref())
                            .map_or_else(|| ms(result.duration), |e| e.wall_ms),
                        usage: o.usage,
                    }
                }
                Err(e) => TestReport {
                    name: t.name.clone(),
                    status: Status::SandboxError,
                    passed: t.expected_stdout.as_ref().map(|_| false),
                    exit_code: None,
                    signal: None,
                    stdout: String::new(),
                    stderr: e.to_string(),
                    stdout_truncated: false,
                    stderr_truncated: false,
                    duration_ms: 0,
                    usage: Usage::default(),
                },
            };
            cases.push(case);
        }
        let passed = cases
            .iter()
            .filter(|c| c.passed.unwrap_or(c.status == Status::Succeeded))
            .count() as u64;
        let total = cases.len() as u64;
        const SEVERITY: [Status; 5] = [
            Status::SandboxError,
            Status::Stopped,
            Status::TimedOut,
            Status::OutOfMemory,
            Status::Failed,
        ];
        report.status = SEVERITY
            .into_iter()
            .find(|s| cases.iter().any(|c| c.status == *s))
            .unwrap_or(Status::Succeeded);
        report.usage = Usage {
            cpu_time_ms: cases.iter().map(|c| c.usage.cpu_time_ms).sum(),
            peak_memory_kb: cases.iter().filter_map(|c| c.usage.peak_memory_kb).max(),
        };
        report.message = format!("{passed} of {total} tests passed");
        report.tests_summary = Some(TestsSummary {
            passed,
            failed: total - passed,
            total,
        });
        report.tests = cases;
    }

    /// The compile stage, or its verdict from the compile cache when the same inputs were
    /// compiled before. `None` when the run should not go on (the report then says why).
    async fn compile_cached(
        &self,
        run_id: &str,
        req: &ValidRequest,
        report: &mut RunReport,
        cancel: &CancellationToken,
    ) -> Result<Option<Vec<Entry>>, SandboxFailure> {
        let lang = &req.language;
        let image = self
            .engine
            .inspect_image(&lang.image.tag)
            .await?
            .ok_or_else(|| SandboxFailure::ImageMissing {
                tag: lang.image.tag.clone(),
                image: lang.image.name.clone(),
            })?;
        report.image_id = Some(image.id.clone());
        let key = cache::key(&image.id, lang, &req.code, &req.files);
        let from_cache = |c: &CompileReport| CompileReport {
            cached: true,
            duration_ms: 0,
            usage: Usage::default(),
            ..c.clone()
        };
        match self.cache.get(&key) {
            Some(Verdict::Compiled {
                report: c,
                artifacts,
            }) => {
                report.compile = Some(from_cache(&c));
                return Ok(Some(artifacts.to_vec()));
            }
            Some(Verdict::Refused { report: c }) => {
                report.stage = Some(Stage::Compile);
                report.status = Status::CompileError;
                report.exit_code = c.exit_code;
                report.message = format!(
                    "compilation failed with exit code {} (the same code and files failed before); the compiler's output is in compile.stderr",
                    c.exit_code.unwrap_or(-1)
                );
                report.compile = Some(from_cache(&c));
                return Ok(None);
            }
            None => {}
        }
        let compiled = self.compile(run_id, req, report, cancel).await?;
        if let Some(c) = &report.compile {
            match &compiled {
                Some(artifacts) => self.cache.put(
                    key,
                    Verdict::Compiled {
                        report: c.clone(),
                        artifacts: Arc::new(artifacts.clone()),
                    },
                ),
                None if report.status == Status::CompileError => {
                    self.cache.put(key, Verdict::Refused { report: c.clone() })
                }
                None => {}
            }
        }
        Ok(compiled)
    }

    /// The compile stage: the source and files in, the whole working directory back. `None`
    /// when the run should not go on (the report then says why).
    async fn compile(
        &self,
        run_id: &str,
        req: &ValidRequest,
        report: &mut RunReport,
        cancel: &CancellationToken,
    ) -> Result<Option<Vec<Entry>>, SandboxFailure> {
        let lang = &req.language;
        let limits = lang.compile_limits;
        let timeout = Duration::from_secs_f64(limits.timeout_seconds);
        let want = Want {
            name: format!("codebox-{run_id}-compile"),
            image_tag: lang.image.tag.clone(),
            image_name: lang.image.name.clone(),
            limits: Limits {
                memory_mb: limits.memory_mb,
                cpus: limits.cpus,
            },
            workspace_mb: limits.workspace_mb,
            labels: self.labels(
                run_id,
                timeout + Duration::from_secs_f64(req.limits.timeout_seconds),
            ),
        };
        let container = self.acquire(&want).await?;
        let payload = Payload {
            env: lang.env.clone(),
            run: lang.compile.clone(),
            timeout,
            output_limit: self.config.sandbox.output_limit_bytes,
            collect: Some(Collect::WorkspaceOnSuccess {
                max_bytes: mb(limits.workspace_mb),
            }),
            entries: Executor::sources(req),
            ..Default::default()
        };
        report.stage = Some(Stage::Compile);
        let result = self
            .stage(
                &want,
                container,
                payload,
                timeout,
                mb(limits.workspace_mb),
                cancel,
            )
            .await?;
        report.image_id = result.image_id.clone();
        let Some(phase) = result.decoded.phase(PhaseName::Run) else {
            let o = classify(None, &result);
            return Err(SandboxFailure::Sandbox(
                o.problem
                    .unwrap_or_else(|| "the compile stage did not start".into()),
            ));
        };
        let o = classify(Some(phase), &result);
        if o.status != Status::Succeeded {
            self.finish_compile(report, o, phase, &result, lang, true);
            return Ok(None);
        }
        report.compile = Some(compile_report(Status::Succeeded, phase, &result, o.usage));
        if let Some(fatal) = &result.decoded.fatal {
            return Err(SandboxFailure::Sandbox(fatal.clone()));
        }
        let mut artifacts = Vec::with_capacity(result.decoded.files.len());
        for f in result.decoded.files {
            if !safe_relative(&f.path) {
                return Err(SandboxFailure::Sandbox(format!(
                    "the compile stage handed back a path outside its working directory: {:?}",
                    f.path
                )));
            }
            artifacts.push(Entry {
                kind: f.kind,
                path: f.path,
                mode: f.mode & 0o777,
                content: if f.kind == EntryKind::File {
                    Bytes::from(f.content)
                } else {
                    Bytes::new()
                },
                target: f.target,
            });
        }
        Ok(Some(artifacts))
    }

    /// Record a compile stage (or check) that did not succeed: the run ends here.
    fn finish_compile(
        &self,
        report: &mut RunReport,
        o: Outcome,
        phase: &protocol::Phase,
        result: &StageResult,
        lang: &Language,
        separate_stage: bool,
    ) {
        let limits = lang.compile_limits;
        let what = if separate_stage {
            "compilation"
        } else {
            "the syntax check"
        };
        let (status, message) = match o.status {
            Status::Stopped => (Status::Stopped, format!("stopped during {what}")),
            Status::TimedOut => (
                Status::TimedOut,
                format!(
                    "{what} was killed at its {} s wall-clock limit",
                    fmt_num(limits.timeout_seconds)
                ),
            ),
            Status::OutOfMemory => (
                Status::OutOfMemory,
                format!(
                    "{what} was killed by the out-of-memory killer at its {} MB limit",
                    if separate_stage {
                        limits.memory_mb
                    } else {
                        report.limits.memory_mb
                    }
                ),
            ),
            Status::SandboxError => (Status::SandboxError, o.problem.clone().unwrap_or_default()),
            _ => (
                Status::CompileError,
                format!(
                    "{what} failed with exit code {}; the compiler's output is in compile.stderr",
                    o.exit_code.unwrap_or(-1)
                ),
            ),
        };
        report.compile = Some(compile_report(status, phase, result, o.usage.clone()));
        report.stage = Some(Stage::Compile);
        report.status = status;
        report.exit_code = o.exit_code.filter(|_| status == Status::CompileError);
        report.signal = if status == Status::CompileError {
            o.signal
        } else {
            None
        };
        report.message = message;
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

/// How many containers of a run execute at once: one, or for test cases as many as the
/// concurrency cap and the memory budget allow (the run manager admits the run for that many).
pub fn parallelism(req: &ValidRequest, config: &Config) -> usize {
    if req.tests.len() <= 1 {
        return 1;
    }
    let by_memory = (config.runs.memory_budget_mb / req.limits.memory_mb.max(1)).max(1) as usize;
    req.tests
        .len()
        .min(config.runs.max_concurrent_runs)
        .min(by_memory)
        .max(1)
}

fn compile_report(
    status: Status,
    phase: &protocol::Phase,
    result: &StageResult,
    usage: Usage,
) -> CompileReport {
    let st = streams(Some(phase));
    let exit_code = phase.end.as_ref().and_then(|e| match e.end {
        protocol::End::Exited(c) => Some(c),
        protocol::End::Signaled(n) => Some(128 + n),
        _ => None,
    });
    CompileReport {
        status,
        exit_code,
        stdout: st.stdout,
        stderr: st.stderr,
        duration_ms: phase
            .end
            .as_ref()
            .map_or_else(|| ms(result.duration), |e| e.wall_ms),
        usage,
        cached: false,
    }
}
