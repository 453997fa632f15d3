//! The generic two-stage executor: compile in a fresh container with a writable workspace,
//! then run in a fresh container whose root filesystem and workspace are read-only.
//!
//! A program's failure is an outcome (`Ok` report); only a broken sandbox is a
//! `sandbox_error`, and the report says what broke.

pub mod archive;
pub mod outcome;
pub mod request;
pub mod uids;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::engine::guard::RunResources;
use crate::engine::posture::{self, PostureViolation, Resources, Workspace, WorkspaceAccess};
use crate::engine::{
    ContainerEngine, Ending, EngineError, Execution, StartOptions, LABEL_EXPIRES, LABEL_INSTANCE,
    LABEL_MANAGED, LABEL_RUN,
};
use crate::report::{fmt_num, CompileReport, RunReport, Stage, Status, Usage};
pub use request::{Encoding, FileInput, LimitsInput, RequestError, RunRequest, ValidRequest};

/// What the idle holder of a tmpfs workspace may use.
const HOLDER_MEMORY_MB: u64 = 16;
const HOLDER_CPUS: f64 = 0.05;
const HOLDER_PIDS: i64 = 8;

/// Extra time before a container counts as abandoned, beyond its limits.
const EXPIRY_MARGIN: Duration = Duration::from_secs(600);

/// Why a run could not be carried out.
#[derive(Debug, thiserror::Error)]
enum SandboxFailure {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Posture(#[from] PostureViolation),
}

/// Runs validated requests on a container engine.
pub struct Executor {
    engine: Arc<dyn ContainerEngine>,
    config: Arc<Config>,
    instance: String,
    uids: Arc<uids::UidPool>,
}

/// A new run id: 32 lowercase hex digits.
pub fn new_run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

impl Executor {
    pub fn new(engine: Arc<dyn ContainerEngine>, config: Arc<Config>, instance: String) -> Self {
        Executor {
            engine,
            config,
            instance,
            uids: uids::UidPool::new(),
        }
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

    /// A report for a run that has not started; the executor fills it in.
    pub fn blank_report(run_id: &str, req: &ValidRequest) -> RunReport {
        RunReport {
            run_id: run_id.to_string(),
            language: req.language.id.clone(),
            status: Status::Queued,
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
            limits: req.limits,
            image_id: None,
            message: "waiting for a free slot".to_string(),
        }
    }

    /// Carry out one run. Never fails: a broken sandbox is reported as `sandbox_error`.
    /// Every container and the volume are removed before this returns, or, if the future is
    /// dropped, in the background right after.
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
        // The run's own uid, held until its containers are gone.
        let lease = self.uids.lease();
        let mut resources = RunResources::new(self.engine.clone());
        if let Err(e) = self
            .stages(run_id, req, lease.uid, &mut report, &mut resources, &cancel)
            .await
        {
            report.status = Status::SandboxError;
            report.message = e.to_string();
        }
        if let Err(e) = resources.release().await {
            tracing::warn!(run_id, error = %e, "removing the run's containers failed; they will be reaped");
        }
        drop(lease);
        report.duration_ms = ms(started.elapsed());
        report
    }

    /// Run one command in a locked-down container with no workspace (the `doctor` posture
    /// probe, toolchain version checks). Same posture as a run stage.
    pub async fn probe(
        &self,
        image_tag: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<Execution, String> {
        let run_id = new_run_id();
        let mut labels = self.labels(&run_id, timeout.as_secs_f64());
        labels.insert("codebox.probe".into(), "true".into());
        let sandbox = &self.config.sandbox;
        let name = format!("codebox-{run_id}-probe");
        let lease = self.uids.lease();
        let spec = posture::locked_down(
            &name,
            image_tag,
            cmd,
            &BTreeMap::new(),
            None,
            &self.resources(
                lease.uid,
                self.config.limits.default_memory_mb,
                self.config.limits.default_cpus,
            ),
            labels,
            false,
        );
        posture::check(&spec, WorkspaceAccess::ReadOnly).map_err(|e| e.to_string())?;
        let mut resources = RunResources::new(self.engine.clone());
        resources.track_container(&name);
        let result = async {
            self.engine.create_container(&spec).await?;
            self.engine
                .start_and_wait(
                    &name,
                    StartOptions {
                        stdin: None,
                        output_limit: sandbox.output_limit_bytes,
                        timeout,
                    },
                    CancellationToken::new(),
                )
                .await
        }
        .await;
        let released = resources.release().await;
        drop(lease);
        let exec = result.map_err(|e| e.to_string())?;
        released.map_err(|e| e.to_string())?;
        Ok(exec)
    }

    /// What a probe, compile or run container may use: the given memory and CPU, the
    /// operator's fixed sandbox limits for the rest.
    fn resources(&self, uid: u32, memory_mb: u64, cpus: f64) -> Resources {
        let sandbox = &self.config.sandbox;
        Resources {
            uid,
            memory_mb,
            cpus,
            pids_limit: sandbox.pids_limit,
            tmpfs_mb: sandbox.tmpfs_mb,
            max_file_size_mb: sandbox.max_file_size_mb,
        }
    }

    fn labels(&self, run_id: &str, budget_seconds: f64) -> BTreeMap<String, String> {
        let expires = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            + Duration::from_secs_f64(budget_seconds)
            + EXPIRY_MARGIN;
        BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_RUN.to_string(), run_id.to_string()),
            (LABEL_INSTANCE.to_string(), self.instance.clone()),
            (LABEL_EXPIRES.to_string(), expires.as_secs().to_string()),
        ])
    }

    async fn stages(
        &self,
        run_id: &str,
        req: &ValidRequest,
        uid: u32,
        report: &mut RunReport,
        resources: &mut RunResources,
        cancel: &CancellationToken,
    ) -> Result<(), SandboxFailure> {
        let lang = &req.language;
        let sandbox = &self.config.sandbox;
        let image = self
            .engine
            .inspect_image(&lang.image.tag)
            .await?
            .ok_or_else(|| EngineError::ImageMissing {
                tag: lang.image.tag.clone(),
                image: lang.image.name.clone(),
            })?;
        report.image_id = Some(image.id);
        let labels = self.labels(
            run_id,
            lang.compile_limits.timeout_seconds + req.limits.timeout_seconds,
        );

        let volume = format!("codebox-{run_id}");
        resources.track_volume(&volume);
        let compile_limits = lang.compile_limits;
        match compile_limits.workspace_mb {
            None => self.engine.create_volume(&volume, &labels).await?,
            Some(size_mb) => {
                self.engine
                    .create_tmpfs_volume(&volume, &labels, size_mb, uid)
                    .await?;
                self.hold(run_id, &lang.image.tag, &volume, &labels, uid, resources)
                    .await?;
            }
        }

        // Prepare the workspace: the compile container, or a loader that is never started.
        let prep_resources = self.resources(uid, compile_limits.memory_mb, compile_limits.cpus);
        let prep_name = format!(
            "codebox-{run_id}-{}",
            if lang.is_compiled() {
                "compile"
            } else {
                "load"
            }
        );
        let prep_cmd = lang
            .compile
            .clone()
            .unwrap_or_else(|| vec!["true".to_string()]);
        let prep = posture::locked_down(
            &prep_name,
            &lang.image.tag,
            prep_cmd,
            &lang.env,
            Some(Workspace {
                volume: volume.clone(),
                writable: true,
            }),
            &prep_resources,
            labels.clone(),
            false,
        );
        posture::check(&prep, WorkspaceAccess::Writable)?;
        resources.track_container(&prep_name);
        self.engine.create_container(&prep).await?;
        let tar = archive::workspace_tar(&lang.source_file, &req.code, &req.files, uid);
        self.engine
            .upload(&prep_name, posture::WORKSPACE, tar)
            .await?;

        if lang.is_compiled() {
            report.stage = Some(Stage::Compile);
            let exec = self
                .engine
                .start_and_wait(
                    &prep_name,
                    StartOptions {
                        stdin: None,
                        output_limit: sandbox.output_limit_bytes,
                        timeout: Duration::from_secs_f64(compile_limits.timeout_seconds),
                    },
                    cancel.clone(),
                )
                .await?;
            let compiled = self.finish_compile(
                report,
                &exec,
                compile_limits.timeout_seconds,
                compile_limits.memory_mb,
            );
            if !compiled {
                return Ok(());
            }
        }
        if cancel.is_cancelled() {
            report.status = Status::Stopped;
            report.message = "stopped before the program ran".into();
            return Ok(());
        }

        report.stage = Some(Stage::Run);
        let run_name = format!("codebox-{run_id}-run");
        let mut cmd = lang.run.clone();
        cmd.extend(req.args.iter().cloned());
        let run = posture::locked_down(
            &run_name,
            &lang.image.tag,
            cmd,
            &lang.env,
            Some(Workspace {
                volume,
                writable: false,
            }),
            &self.resources(uid, req.limits.memory_mb, req.limits.cpus),
            labels,
            req.stdin.is_some(),
        );
        posture::check(&run, WorkspaceAccess::ReadOnly)?;
        resources.track_container(&run_name);
        // The finished compile (or loader) container is removed while the run goes on: off
        // the critical path, still owned by the guard until it is gone.
        let run_stage = async {
            self.engine.create_container(&run).await?;
            self.engine
                .start_and_wait(
                    &run_name,
                    StartOptions {
                        stdin: req.stdin.clone(),
                        output_limit: sandbox.output_limit_bytes,
                        timeout: Duration::from_secs_f64(req.limits.timeout_seconds),
                    },
                    cancel.clone(),
                )
                .await
        };
        let (removed, exec) = tokio::join!(self.engine.remove_container(&prep_name), run_stage);
        if removed.is_ok() {
            resources.untrack_container(&prep_name);
        }
        let exec = exec?;
        self.finish_run(report, &exec, req);
        Ok(())
    }

    /// Start an idle, locked-down container that keeps a tmpfs workspace mounted from the
    /// upload to the end of the run (a tmpfs volume loses its content when nothing mounts it).
    async fn hold(
        &self,
        run_id: &str,
        image: &str,
        volume: &str,
        labels: &BTreeMap<String, String>,
        uid: u32,
        resources: &mut RunResources,
    ) -> Result<(), SandboxFailure> {
        let name = format!("codebox-{run_id}-hold");
        let spec = posture::locked_down(
            &name,
            image,
            vec!["sleep".into(), "infinity".into()],
            &BTreeMap::new(),
            Some(Workspace {
                volume: volume.to_string(),
                writable: false,
            }),
            &Resources {
                uid,
                memory_mb: HOLDER_MEMORY_MB,
                cpus: HOLDER_CPUS,
                pids_limit: HOLDER_PIDS,
                tmpfs_mb: 1,
                max_file_size_mb: 1,
            },
            labels.clone(),
            false,
        );
        posture::check(&spec, WorkspaceAccess::ReadOnly)?;
        resources.track_container(&name);
        self.engine.create_container(&spec).await?;
        self.engine.start(&name).await?;
        Ok(())
    }

    /// Record the compile stage; `true` if the run stage should follow.
    fn finish_compile(
        &self,
        report: &mut RunReport,
        exec: &Execution,
        timeout: f64,
        memory_mb: u64,
    ) -> bool {
        let o = outcome::classify(exec);
        let (status, message) = match o.status {
            Status::Succeeded => (Status::Succeeded, String::new()),
            Status::Stopped => (Status::Stopped, "stopped while compiling".to_string()),
            Status::TimedOut => (
                Status::TimedOut,
                format!("compilation was killed at its {} s wall-clock limit", fmt_num(timeout)),
            ),
            Status::OutOfMemory => (
                Status::OutOfMemory,
                format!("compilation was killed by the out-of-memory killer at its {memory_mb} MB limit"),
            ),
            _ => (
                Status::CompileError,
                format!(
                    "compilation failed with exit code {}; the compiler's output is in compile.stderr",
                    o.exit_code.unwrap_or(-1)
                ),
            ),
        };
        report.compile = Some(CompileReport {
            status,
            exit_code: o.exit_code,
            stdout: exec.stdout.text(),
            stderr: exec.stderr.text(),
            duration_ms: ms(exec.duration),
            usage: exec.usage.clone(),
        });
        if status == Status::Succeeded {
            return true;
        }
        report.status = status;
        report.exit_code = o.exit_code;
        report.signal = if status == Status::CompileError {
            o.signal
        } else {
            None
        };
        report.message = message;
        false
    }

    fn finish_run(&self, report: &mut RunReport, exec: &Execution, req: &ValidRequest) {
        let o = outcome::classify(exec);
        report.status = o.status;
        report.exit_code = o.exit_code;
        report.signal = o.signal.clone();
        report.stdout = exec.stdout.text();
        report.stderr = exec.stderr.text();
        report.stdout_truncated = exec.stdout.truncated();
        report.stderr_truncated = exec.stderr.truncated();
        report.stdout_bytes = exec.stdout.total;
        report.stderr_bytes = exec.stderr.total;
        report.usage = exec.usage.clone();
        let code = o.exit_code.unwrap_or(-1);
        report.message = match (o.status, exec.ending) {
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
            (_, Ending::Exited) => match &o.signal {
                Some(sig) => format!("killed by {sig} (exit code {code})"),
                None => format!("exited with code {code}"),
            },
            _ => format!("ended with exit code {code}"),
        };
    }
}
