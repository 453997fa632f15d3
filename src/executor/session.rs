//! A session's container: created with the posture of every run, opened once, then serving
//! one request after another on the same attach connection (docs/sandbox-init.md, "Session
//! mode"). Requests are strictly one at a time. A container that stops answering, breaks the
//! protocol or dies is broken: it serves nothing more and the session ends.
//!
//! The host trusts `codebox-init` (PID 1, out of the program's reach) for the frames it
//! sends, and no driver: every deadline here is the host's own backstop.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

use super::containers::{labels, Want};
use super::outcome::classify;
use super::stage::{Bound, HostEnding, StageResult, StageTimes};
use super::{Ended, Executor, Halt, Known, SandboxFailure, Streams, BACKSTOP_GRACE};
use crate::engine::guard::ContainerGuard;
use crate::engine::posture::Limits;
use crate::engine::protocol::session::{Done, Exec, Open, Read, Work};
use crate::engine::protocol::{Collect, DecodeLimits, Decoded, Decoder, Entry, Files, PhaseName};
use crate::engine::{InputSink, OutputStream, Signal};
use crate::contract::ValidRequest;
use crate::registry::Language;
use crate::report::{InterpreterState, ResetReason, RunReport, SessionExecution, Stage, Status};

/// How long a driver may take to start (it imports nothing heavy).
pub const DRIVER_START: Duration = Duration::from_secs(30);
/// How long an interrupted driver has to answer before it is started again.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// Beyond an execution's limits and the interrupt's grace: time to start the driver again.
const RESTART_GRACE: Duration = Duration::from_secs(10);
/// How often a stop is signalled again until the execution answers: a SIGTERM that arrives
/// before the request itself reached `codebox-init` is dropped there.
const STOP_REPEAT: Duration = Duration::from_millis(500);
/// How long a `read` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The value of `codebox.run` on a session's container.
pub const SESSION_RUN_LABEL: &str = "session";

/// Why a session's container serves nothing more.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Broken {
    /// The container died of an out-of-memory kill (under gVisor, one takes its kernel).
    #[error("out of memory")]
    OutOfMemory,
    #[error("its sandbox failed: {0}")]
    Failed(String),
}

/// What a session's container is made of.
pub struct SessionSpec<'a> {
    /// Names the container (only a prefix of the id: the id is a secret of its holders).
    pub name: String,
    pub language: &'a Language,
    pub limits: Limits,
    pub workspace_mb: u64,
    pub files: Files,
    /// The session's longest life: the container's expiry label.
    pub lifetime: Duration,
}

struct Io {
    input: InputSink,
    output: OutputStream,
    broken: Option<Broken>,
}

/// An open session's container.
pub struct SessionBox {
    name: String,
    stateful: bool,
    guard: Mutex<Option<ContainerGuard>>,
    io: tokio::sync::Mutex<Io>,
}

/// What one request brought back.
struct Exchange {
    decoded: Decoded,
    stopped: bool,
    duration: Duration,
}

/// One execution in a session: its report, and whether the session's container broke.
pub struct SessionRun {
    pub report: RunReport,
    pub broken: Option<Broken>,
    /// Bytes used in the session's working directory, when known.
    pub workspace_bytes: Option<u64>,
}

/// What a `read` found.
#[derive(Debug)]
pub struct FileRead {
    pub decoded: Decoded,
}

/// Why a `read` gave nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The container answered: no such file, not allowed...
    #[error("{0}")]
    Refused(String),
    #[error("session {0}")]
    Broken(Broken),
}

impl SessionBox {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_stateful(&self) -> bool {
        self.stateful
    }

    /// Remove the container (in the background). Idempotent.
    pub fn close(&self) {
        let guard = self.guard.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(g) = guard {
            g.remove_later();
        }
    }
}

impl Drop for SessionBox {
    fn drop(&mut self) {
        self.close();
    }
}

impl Executor {
    /// Create, start and open a session's container; the driver (if any) is ready when this
    /// returns.
    pub async fn open_session(&self, spec: SessionSpec<'_>) -> Result<SessionBox, SandboxFailure> {
        let lang = spec.language;
        let want = Want {
            name: spec.name.clone(),
            image_tag: lang.image.tag.clone(),
            image_name: lang.image.name.clone(),
            limits: spec.limits,
            workspace_mb: spec.workspace_mb,
            labels: labels(
                SESSION_RUN_LABEL,
                &self.instance,
                spec.lifetime + DRIVER_START,
            ),
        };
        let never = CancellationToken::new();
        let bound = Bound {
            cancel: &never,
            deadline: tokio::time::Instant::now() + DRIVER_START + BACKSTOP_GRACE,
        };
        let halted = |h: Halt| match h {
            Halt::Failed(f) => f,
            Halt::Stopped => SandboxFailure::Reported("stopped while opening".into()),
        };
        let acquired = self.create(&want, bound).await.map_err(halted)?;
        let guard = acquired.guard;
        let attached = bound
            .call(
                "attaching to the container",
                self.engine.attach_container(guard.name()),
            )
            .await
            .map_err(|e| halted(Halt::bound(e)))?;
        bound
            .call(
                "starting the container",
                self.engine.start_container(guard.name()),
            )
            .await
            .map_err(|e| halted(Halt::bound(e)))?;
        let sbox = SessionBox {
            name: want.name,
            stateful: lang.is_stateful(),
            guard: Mutex::new(Some(guard)),
            io: tokio::sync::Mutex::new(Io {
                input: attached.input,
                output: attached.output,
                broken: None,
            }),
        };
        let open = Open {
            driver: lang.session_driver.clone(),
            env: lang.env.clone(),
            files: spec.files,
            start_timeout: DRIVER_START,
        };
        let limits = DecodeLimits {
            output: self.config.sandbox.output_limit_bytes,
            content: 0,
            entries: 0,
        };
        match self
            .exchange(
                &sbox,
                open.encode(),
                limits,
                DRIVER_START + BACKSTOP_GRACE,
                None,
            )
            .await
        {
            Ok(x) => match (x.decoded.fatal, x.decoded.done) {
                (Some(fatal), _) => Err(SandboxFailure::Reported(fatal)),
                (None, Some(Done { error: None, .. })) => Ok(sbox),
                (None, Some(Done { error: Some(e), .. })) => Err(SandboxFailure::Reported(e)),
                (None, None) => Err(SandboxFailure::Reported(
                    "the session's container did not open".into(),
                )),
            },
            Err(broken) => Err(SandboxFailure::Reported(format!(
                "the session's container did not open: {broken}"
            ))),
        }
    }

    /// Send one request and read its frames until its `D` (or the container's `Z` or a fatal
    /// error). `cancel` interrupts an execution (SIGTERM to `codebox-init`, which interrupts
    /// the driver and answers). Past `backstop` the container counts as broken.
    async fn exchange(
        &self,
        sbox: &SessionBox,
        request: Vec<Bytes>,
        limits: DecodeLimits,
        backstop: Duration,
        cancel: Option<&CancellationToken>,
    ) -> Result<Exchange, Broken> {
        let began = Instant::now();
        let mut io = sbox.io.lock().await;
        if let Some(b) = &io.broken {
            return Err(b.clone());
        }
        let outcome = self
            .exchange_locked(sbox, &mut io, request, limits, backstop, cancel)
            .await;
        if let Err(b) = &outcome {
            io.broken = Some(b.clone());
        }
        outcome.map(|(decoded, stopped)| Exchange {
            decoded,
            stopped,
            duration: began.elapsed(),
        })
    }

    async fn exchange_locked(
        &self,
        sbox: &SessionBox,
        io: &mut Io,
        request: Vec<Bytes>,
        limits: DecodeLimits,
        backstop: Duration,
        cancel: Option<&CancellationToken>,
    ) -> Result<(Decoded, bool), Broken> {
        let mut deadline = tokio::time::Instant::now() + backstop;
        let never = CancellationToken::new();
        let cancel = cancel.unwrap_or(&never);
        let late = || Broken::Failed("codebox-init stopped answering".into());
        let write = async {
            for part in &request {
                io.input.write_all(part).await?;
            }
            io.input.flush().await
        };
        // A stop before the request is written leaves the container as it was.
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ok((Decoded::default(), true)),
            written = tokio::time::timeout_at(deadline, write) => match written {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(self.why_broken(sbox, format!("writing to it failed: {e}")).await),
                Err(_) => return Err(late()),
            },
        }
        let mut decoder = Decoder::new(limits);
        let mut stopped = false;
        let mut again = tokio::time::interval(STOP_REPEAT);
        loop {
            tokio::select! {
                item = io.output.next() => match item {
                    Some(Ok(crate::engine::Output::Stdout(bytes))) => {
                        if let Err(e) = decoder.push(&bytes) {
                            return Err(Broken::Failed(e.to_string()));
                        }
                        let d = decoder.decoded();
                        if d.fatal.is_some() {
                            let fatal = d.fatal.clone().unwrap_or_default();
                            return Err(Broken::Failed(format!("codebox-init: {fatal}")));
                        }
                        if d.complete {
                            return Ok((decoder.finish(), stopped));
                        }
                    }
                    // Only codebox-init writes the container's stderr, and only when it
                    // cannot start; a session's container has started.
                    Some(Ok(crate::engine::Output::Stderr(_))) => {}
                    Some(Err(e)) => return Err(self.why_broken(sbox, e.to_string()).await),
                    None => return Err(self.why_broken(sbox, "its output ended".into()).await),
                },
                _ = cancel.cancelled(), if !stopped => {
                    stopped = true;
                    again.reset();
                    if let Err(e) = self.engine.kill_container(&sbox.name, Signal::Term).await {
                        return Err(Broken::Failed(e.to_string()));
                    }
                    deadline = deadline.min(
                        tokio::time::Instant::now() + INTERRUPT_GRACE + RESTART_GRACE + BACKSTOP_GRACE,
                    );
                }
                _ = again.tick(), if stopped => {
                    if let Err(e) = self.engine.kill_container(&sbox.name, Signal::Term).await {
                        return Err(Broken::Failed(e.to_string()));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Err(late()),
            }
        }
    }

    /// Why a session's container went away: an out-of-memory kill, or what the engine says.
    async fn why_broken(&self, sbox: &SessionBox, what: String) -> Broken {
        let state = tokio::time::timeout(
            super::stage::WAIT_GRACE,
            self.engine.inspect_container(&sbox.name),
        )
        .await;
        match state {
            Ok(Ok(s)) if s.oom_killed => Broken::OutOfMemory,
            Ok(Ok(s)) if s.exit_code == Some(137) => {
                let recorded = tokio::time::timeout(
                    super::stage::OOM_RECORD_GRACE,
                    self.engine.oom_event(&sbox.name),
                )
                .await;
                if matches!(recorded, Ok(Ok(true))) {
                    Broken::OutOfMemory
                } else {
                    Broken::Failed(format!("{what} (the container exited with code 137)"))
                }
            }
            Ok(Ok(s)) => Broken::Failed(match s.exit_code {
                Some(code) => format!("{what} (the container exited with code {code})"),
                None => what,
            }),
            _ => Broken::Failed(what),
        }
    }

    /// Carry out one execution of a session. Never fails: the report says what happened, and
    /// [`SessionRun::broken`] whether the session's container is gone.
    pub async fn execute_in_session(
        &self,
        sbox: &SessionBox,
        session: SessionExecution,
        run_id: &str,
        req: &ValidRequest,
        queued_ms: u64,
        cancel: CancellationToken,
    ) -> SessionRun {
        let started = Instant::now();
        let bound = Bound {
            cancel: &cancel,
            deadline: tokio::time::Instant::now() + Executor::budget(req) + BACKSTOP_GRACE,
        };
        let mut known = Known::default();
        let mut broken = None;
        let mut workspace_bytes = None;
        let mut state = (InterpreterState::Kept, None);
        let ended = match self
            .prepare_execution(run_id, req, session.execution_count, &mut known, bound)
            .await
        {
            Err(Halt::Stopped) => Ended::Stopped,
            Err(Halt::Failed(f)) => Ended::Failed(f),
            Ok(Err(end)) => Ended::AtCompile(end),
            Ok(Ok(exec)) => {
                known.stage = Some(Stage::Run);
                let backstop = exec.check_timeout
                    + exec.timeout
                    + exec.interrupt
                    + RESTART_GRACE
                    + BACKSTOP_GRACE;
                let s = &self.config.sandbox;
                let limits = DecodeLimits {
                    output: s.output_limit_bytes,
                    content: s.max_output_bytes,
                    entries: super::containers::MAX_OUTPUT_ENTRIES,
                };
                match self
                    .exchange(sbox, exec.encode(), limits, backstop, Some(&cancel))
                    .await
                {
                    Ok(x) => {
                        let done = x.decoded.done.clone().unwrap_or_default();
                        workspace_bytes = done.workspace_bytes;
                        if let Some(s) = done.state {
                            state = (s, done.reason);
                        }
                        self.session_ended(req, &mut known, x, done)
                    }
                    Err(b) => {
                        state = (
                            InterpreterState::Reset,
                            Some(if b == Broken::OutOfMemory {
                                ResetReason::OutOfMemory
                            } else {
                                ResetReason::DriverExited
                            }),
                        );
                        let ended = match &b {
                            Broken::OutOfMemory => Ended::Ran {
                                outcome: super::outcome::Outcome {
                                    status: Status::OutOfMemory,
                                    exit_code: None,
                                    signal: Some("SIGKILL".into()),
                                    problem: None,
                                    usage: Default::default(),
                                },
                                streams: Streams::of(None),
                                files: Vec::new(),
                                result: None,
                            },
                            Broken::Failed(why) => Ended::Failed(SandboxFailure::Reported(
                                format!("the session ended: its sandbox failed: {why}"),
                            )),
                        };
                        broken = Some(b);
                        ended
                    }
                }
            }
        };
        let mut report = Executor::report(run_id, req, known, ended);
        report.queued_ms = queued_ms;
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.session = Some(SessionExecution {
            state: if sbox.stateful {
                state.0
            } else {
                files_only_state(&session)
            },
            reset_reason: if sbox.stateful { state.1 } else { None },
            ..session
        });
        SessionRun {
            report,
            broken,
            workspace_bytes,
        }
    }

    /// The execution request: compiled first where the language compiles (in a compile
    /// container of its own, the cache included), or how the run ends before it.
    async fn prepare_execution(
        &self,
        run_id: &str,
        req: &ValidRequest,
        execution_count: u64,
        known: &mut Known,
        bound: Bound<'_>,
    ) -> Result<Result<Exec, super::CompileEnd>, Halt> {
        let lang = &req.language;
        let s = &self.config.sandbox;
        let request_files = || -> Vec<Entry> {
            req.files
                .iter()
                .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone()))
                .collect()
        };
        let mut run = lang.run.clone();
        run.extend(req.args.iter().cloned());
        let (work, files, check_timeout) = if lang.is_compiled() {
            match self.compile_cached(run_id, req, known, bound).await? {
                Ok(files) => (Work::Commands { check: None, run }, files, Duration::ZERO),
                Err(end) => return Ok(Err(end)),
            }
        } else if lang.is_stateful() {
            (
                Work::Cell(Bytes::from(req.code.clone().into_bytes())),
                Files::new(&request_files()),
                Duration::from_secs_f64(lang.compile_limits.timeout_seconds),
            )
        } else {
            (
                Work::Commands {
                    check: lang.check.clone(),
                    run,
                },
                Files::new(&Executor::sources(req)),
                Duration::from_secs_f64(lang.compile_limits.timeout_seconds),
            )
        };
        if bound.cancel.is_cancelled() {
            return Err(Halt::Stopped);
        }
        Ok(Ok(Exec {
            work,
            env: lang.env.clone(),
            files,
            stdin: req.stdin.clone().unwrap_or_default(),
            check_timeout,
            timeout: Duration::from_secs_f64(req.limits.timeout_seconds),
            output_limit: s.output_limit_bytes,
            collect: Collect::Outputs {
                max_files: s.max_output_files,
                max_bytes: s.max_output_bytes,
                max_file_bytes: s.max_output_file_bytes,
            },
            reset: req.session.as_ref().is_some_and(|t| t.reset),
            interrupt: INTERRUPT_GRACE,
            execution_count,
        }))
    }

    /// How an execution's frames end the run.
    fn session_ended(
        &self,
        req: &ValidRequest,
        known: &mut Known,
        x: Exchange,
        done: Done,
    ) -> Ended {
        if let Some(error) = done.error {
            return Ended::Failed(SandboxFailure::Reported(error));
        }
        let result = StageResult {
            decoded: x.decoded,
            protocol_error: None,
            stream_error: None,
            stderr: Vec::new(),
            host_ending: if x.stopped {
                HostEnding::Stopped
            } else {
                HostEnding::Finished
            },
            exit_code: None,
            oom_killed: false,
            image_id: None,
            duration: x.duration,
            times: StageTimes::default(),
        };
        if let Some(end) = self.check_failed(&result, &req.language, known, req.limits.memory_mb) {
            return Ended::AtCompile(end);
        }
        let phase = result.decoded.phase(PhaseName::Run);
        let kept = result.decoded.result.clone();
        Ended::Ran {
            outcome: classify(phase, &result),
            streams: Streams::of(phase),
            files: super::outputs::report_files(&result.decoded.files),
            result: kept.map(|r| {
                let truncated = done.result_bytes > r.len() as u64;
                (String::from_utf8_lossy(&r).into_owned(), truncated)
            }),
        }
    }

    /// Read a file or folder of a session's working directory without running anything.
    pub async fn read_in_session(
        &self,
        sbox: &SessionBox,
        path: &str,
        offset: u64,
        max_bytes: u64,
    ) -> Result<FileRead, ReadError> {
        let limits = DecodeLimits {
            output: self.config.sandbox.output_limit_bytes,
            content: max_bytes,
            entries: 10_000,
        };
        let read = Read {
            path: path.to_string(),
            offset,
            max_bytes,
        };
        let x = self
            .exchange(sbox, read.encode(), limits, READ_TIMEOUT, None)
            .await
            .map_err(ReadError::Broken)?;
        match x.decoded.done.as_ref().and_then(|d| d.error.clone()) {
            Some(error) => Err(ReadError::Refused(error)),
            None => Ok(FileRead { decoded: x.decoded }),
        }
    }
}

/// A files-only session's interpreter state: `new` for its first execution, then `kept`.
fn files_only_state(session: &SessionExecution) -> InterpreterState {
    if session.execution_count <= 1 {
        InterpreterState::New
    } else {
        InterpreterState::Kept
    }
}
