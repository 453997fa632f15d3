//! A session's container: created with the posture of every run, opened once, then serving
//! one request after another on the same attach connection (docs/sandbox-init.md, "Session
//! mode"). One task, owned by the [`SessionBox`], holds that connection and carries out the
//! requests strictly one at a time in arrival order, each through the one exchange with
//! `codebox-init` ([`super::exchange`]): a request is always written whole and its answer read
//! to its end, whether or not its caller still waits, so the stream never gets out of step. A
//! container that stops answering, breaks the protocol or dies is broken: it serves nothing
//! more and the session ends.
//!
//! The host trusts `codebox-init` (PID 1, out of the program's reach) for the frames it
//! sends, and no driver: every deadline here is the host's own backstop, derived from the
//! durations it sends `codebox-init` ([`InitTimes`]).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::FutureExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::compile::{check_failed, Compiler};
use super::containers::{Containers, Mount, Want};
pub(crate) use super::ends::Broken;
use super::ends::{sources, Call, CompileEnd, Ended, Halt, Known, SandboxFailure, BACKSTOP_GRACE};
use super::exchange::{write_request, Exchange, HostEnding, StopRule, Until, Watch};
use super::finish::report;
use super::labels::labels;
use super::outcome::classify;
use super::outcome::Streams;
use super::packages::session::SessionPrefix;
use super::packages::{InstallEnd, InstallFailure, Packages};
use super::stage::{Answer, Bound, StageTimes};
use crate::config::Config;
use crate::contract::ValidRequest;
use crate::engine::guard::ContainerGuard;
use crate::engine::posture::Limits;
use crate::engine::protocol::session::{Done, Exec, InitTimes, Open, Read, Work};
use crate::engine::protocol::{Collect, DecodeLimits, Decoded, Entry, Files, PhaseName};
use crate::engine::{Attached, ContainerEngine, InputSink, OutputStream};
use crate::live::Pen;
use crate::registry::Language;
use crate::report::{InterpreterState, ResetReason, RunReport, SessionExecution, Stage, Status};

/// What `codebox-init` is told, and the host's deadlines follow from.
pub const SESSION_TIMES: InitTimes = InitTimes::DEFAULT;
/// How often a stop is signalled again until the execution answers: a SIGTERM that arrives
/// before the request itself reached `codebox-init` is dropped there.
const STOP_REPEAT: Duration = Duration::from_millis(500);
/// How long a `read` may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// The value of `codebox.run` on a session's container.
pub const SESSION_RUN_LABEL: &str = "session";

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
    /// Packages to install before it opens (its language must take packages).
    pub packages: Vec<String>,
}

/// One request for the session's conversation task.
struct Ask {
    request: Vec<Bytes>,
    limits: DecodeLimits,
    /// The answer is due within this, from when the request's turn comes.
    backstop: Duration,
    cancel: CancellationToken,
    /// Where the answer is shown as it arrives.
    live: Option<Pen>,
    reply: oneshot::Sender<Result<Heard, Broken>>,
}

/// What one request brought back.
struct Heard {
    decoded: Decoded,
    stopped: bool,
    /// The session's container was ended while the answer was awaited.
    closed: bool,
    duration: Duration,
}

/// An open session's container.
pub struct SessionBox {
    name: String,
    stateful: bool,
    guard: Mutex<Option<ContainerGuard>>,
    /// `true` once the container's removal has ended.
    removed: watch::Receiver<bool>,
    asks: mpsc::UnboundedSender<Ask>,
    /// Cancelled when the container is ended: the request being answered ends at once.
    ended: CancellationToken,
    _conversation: AbortOnDropHandle<()>,
    /// Its own packages volume, mounted read-only (languages that take packages).
    packages: Option<SessionPrefix>,
    /// The image its container was created from (what its packages install for).
    image_id: String,
}

/// One execution in a session: its report, and whether the session's container broke.
pub(crate) struct SessionRun {
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
pub(crate) enum ReadError {
    /// The container answered: no such file, not allowed...
    #[error("{0}")]
    Refused(String),
    #[error("session {0}")]
    Broken(Broken),
}

impl SessionBox {
    /// The session's container, whose attach connection is `attached`: the conversation task
    /// starts now and ends with the box.
    fn new(
        engine: Arc<dyn ContainerEngine>,
        guard: ContainerGuard,
        stateful: bool,
        attached: Attached,
        packages: Option<SessionPrefix>,
        image_id: String,
    ) -> SessionBox {
        let name = guard.name().to_string();
        let (asks, queue) = mpsc::unbounded_channel();
        let ended = CancellationToken::new();
        let conversation = Conversation {
            engine,
            name: name.clone(),
            input: attached.input,
            output: attached.output,
            ended: ended.clone(),
            broken: None,
        };
        SessionBox {
            name,
            stateful,
            removed: guard.removed(),
            guard: Mutex::new(Some(guard)),
            asks,
            ended,
            _conversation: AbortOnDropHandle::new(tokio::spawn(conversation.run(queue))),
            packages,
            image_id,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_stateful(&self) -> bool {
        self.stateful
    }

    /// End the container now: what runs in it is killed with it, not interrupted (the
    /// execution being answered ends at once as `stopped`), no driver is started again, and
    /// the container is removed in the background. Idempotent.
    pub(crate) fn end_now(&self) {
        self.ended.cancel();
        let guard = self.guard.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(g) = guard {
            g.remove_later();
        }
        if let Some(p) = &self.packages {
            p.remove_after(self.container_removed());
        }
    }

    /// Remove the container: `SessionBox::end_now`.
    pub fn close(&self) {
        self.end_now();
    }

    /// Ends when the container's removal, and its packages volume's, have ended (started
    /// by `SessionBox::end_now`).
    pub fn removed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let container = self.container_removed();
        let volume = self.packages.as_ref().map(|p| p.removed());
        async move {
            container.await;
            if let Some(v) = volume {
                v.await;
            }
        }
    }

    fn container_removed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut removed = self.removed.clone();
        async move {
            let _ = removed.wait_for(|done| *done).await;
        }
    }

    /// Have the conversation task carry out one request: its answer, or why the container is
    /// broken. Dropping this future leaves the request to be carried out (or, not yet begun,
    /// passed over), never cut.
    async fn ask(
        &self,
        request: Vec<Bytes>,
        limits: DecodeLimits,
        backstop: Duration,
        cancel: Option<&CancellationToken>,
        live: Option<Pen>,
    ) -> Result<Heard, Broken> {
        let (reply, answer) = oneshot::channel();
        let ask = Ask {
            request,
            limits,
            backstop,
            live,
            cancel: cancel.cloned().unwrap_or_default(),
            reply,
        };
        let gone = || Broken::Failed("its container is gone".into());
        self.asks.send(ask).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

impl Drop for SessionBox {
    fn drop(&mut self) {
        self.close();
    }
}

/// The task that holds a session's attach connection and answers its requests in turn.
struct Conversation {
    engine: Arc<dyn ContainerEngine>,
    name: String,
    input: InputSink,
    output: OutputStream,
    ended: CancellationToken,
    broken: Option<Broken>,
}

impl Conversation {
    async fn run(mut self, mut queue: mpsc::UnboundedReceiver<Ask>) {
        while let Some(ask) = queue.recv().await {
            if ask.reply.is_closed() {
                continue; // its caller went away before its turn: nothing was sent
            }
            if self.broken.is_none() && self.ended.is_cancelled() {
                self.broken = Some(Broken::Failed("the session was closed".into()));
            }
            if let Some(b) = &self.broken {
                let _ = ask.reply.send(Err(b.clone()));
                continue;
            }
            if ask.cancel.is_cancelled() {
                // A stop before the request is written leaves the container as it was.
                let heard = Heard {
                    decoded: Decoded::default(),
                    stopped: true,
                    closed: false,
                    duration: Duration::ZERO,
                };
                let _ = ask.reply.send(Ok(heard));
                continue;
            }
            let (answer, reply) = self.answer(ask).await;
            if let Err(b) = &answer {
                self.broken = Some(b.clone());
            }
            let _ = reply.send(answer);
        }
    }

    /// Write one request whole and read its answer to its `D`. A stop (or the caller going
    /// away) is signalled while the request is written, never by cutting it: `codebox-init`
    /// reads it whole and answers `stopped`.
    async fn answer(
        &mut self,
        mut ask: Ask,
    ) -> (
        Result<Heard, Broken>,
        oneshot::Sender<Result<Heard, Broken>>,
    ) {
        let began = Instant::now();
        let rule = StopRule {
            grace: SESSION_TIMES.after_stop() + BACKSTOP_GRACE,
            repeat: Some(STOP_REPEAT),
        };
        let engine = self.engine.clone();
        let mut ex = Exchange::new(
            engine.as_ref(),
            &self.name,
            ask.limits,
            ask.backstop,
            rule,
            Until::Answered,
        )
        .with_live(ask.live.take(), true);
        let stop = CancellationToken::new();
        let mut written = None;
        let listened = {
            let mut write = std::pin::pin!(write_request(
                &mut self.input,
                std::mem::take(&mut ask.request)
            ));
            let mut listen = std::pin::pin!(ex.listen(&mut self.output, &stop, &self.ended));
            let cancel = ask.cancel.clone();
            let reply = &mut ask.reply;
            let mut watch_stop = std::pin::pin!(async {
                tokio::select! {
                    _ = cancel.cancelled() => {}
                    _ = reply.closed() => {}
                }
                stop.cancel();
                std::future::pending::<()>().await
            });
            let listened = loop {
                tokio::select! {
                    w = &mut write, if written.is_none() => written = Some(w),
                    l = &mut listen => break l,
                    _ = &mut watch_stop => {}
                }
            };
            if written.is_none() {
                written = (&mut write).now_or_never();
            }
            listened
        };
        let duration = began.elapsed();
        let answer = match listened {
            Err(e) => Err(Broken::Failed(format!("signalling it failed: {e}"))),
            Ok(()) if ex.closed => Ok(Heard {
                decoded: ex.into_decoded(),
                stopped: true,
                closed: true,
                duration,
            }),
            Ok(()) => Conversation::heard(ex, written, duration).await,
        };
        (answer, ask.reply)
    }

    /// What an exchange that ended by itself came to.
    async fn heard(
        ex: Exchange<'_>,
        written: Option<std::io::Result<()>>,
        duration: Duration,
    ) -> Result<Heard, Broken> {
        if let Some(e) = &ex.protocol_error {
            return Err(Broken::Failed(e.clone()));
        }
        if let Some(fatal) = &ex.decoded().fatal {
            return Err(Broken::Failed(format!("codebox-init: {fatal}")));
        }
        if ex.answered() {
            return match written {
                Some(Ok(())) => Ok(Heard {
                    stopped: ex.ending == HostEnding::Stopped,
                    decoded: ex.into_decoded(),
                    closed: false,
                    duration,
                }),
                _ => Err(Broken::Failed(
                    "codebox-init answered before it read the whole request".into(),
                )),
            };
        }
        if ex.watch == Watch::Killed || ex.unresponsive {
            let within = match ex.ending {
                HostEnding::Stopped => "its stop's grace",
                _ => "the execution's limits and their grace",
            };
            return Err(Broken::Failed(format!(
                "codebox-init did not answer within {within}; its container was killed"
            )));
        }
        let what = match (&ex.stream_error, &written) {
            (Some(e), _) => e.to_string(),
            (None, Some(Err(e))) => format!("writing to it failed: {e}"),
            _ => "its output ended".to_string(),
        };
        match ex.inspect().await {
            Some(Ok(state)) if ex.out_of_memory(&state, state.exit_code).await => {
                Err(Broken::OutOfMemory)
            }
            Some(Ok(state)) => Err(Broken::Failed(match state.exit_code {
                Some(code) => format!("{what} (the container exited with code {code})"),
                None => what,
            })),
            _ => Err(Broken::Failed(what)),
        }
    }
}

/// What an execution in a session uses beside its box: containers for a compile stage, and
/// the compiler with its cache.
#[derive(Clone, Copy)]
pub(super) struct Stages<'a> {
    pub containers: &'a Containers,
    pub compiler: &'a Compiler,
    pub packages: &'a Packages,
}

impl SessionBox {
    /// Create, start and open a session's container; the driver (if any) is ready when this
    /// returns.
    pub(super) async fn open(
        containers: &Containers,
        spec: SessionSpec<'_>,
        packages: Option<SessionPrefix>,
    ) -> Result<SessionBox, SandboxFailure> {
        let lang = spec.language;
        let start = SESSION_TIMES.driver_start;
        let want = Want {
            name: spec.name.clone(),
            image_tag: lang.image.tag.clone(),
            image_name: lang.image.name.clone(),
            limits: spec.limits,
            workspace_mb: spec.workspace_mb,
            labels: labels(
                SESSION_RUN_LABEL,
                &containers.instance,
                spec.lifetime + start,
            ),
            prefix: packages.as_ref().map(|p| Mount {
                volume: p.volume().to_string(),
                target: p.target().to_string(),
            }),
        };
        let never = CancellationToken::new();
        let bound = Bound::new(&never, tokio::time::Instant::now() + start + BACKSTOP_GRACE);
        let halted = |h: Halt| match h {
            Halt::Failed(f) => f,
            Halt::Stopped => SandboxFailure::StoppedOpening,
        };
        let acquired = containers.create(&want, bound).await.map_err(halted)?;
        let image_id = acquired.image.id.clone();
        let guard = acquired.guard;
        let attached = bound
            .call(
                "attaching to the container",
                containers.engine.attach_container(guard.name()),
            )
            .await
            .map_err(|e| halted(Halt::bound(e)))?;
        bound
            .call(
                "starting the container",
                containers.engine.start_container(guard.name()),
            )
            .await
            .map_err(|e| halted(Halt::bound(e)))?;
        let mut env = lang.env.clone();
        if let Some(p) = &packages {
            env.extend(p.env().clone());
        }
        let sbox = SessionBox::new(
            containers.engine.clone(),
            guard,
            lang.is_stateful(),
            attached,
            packages,
            image_id,
        );
        let open = Open {
            driver: lang.session_driver.clone(),
            env,
            files: spec.files,
            start_timeout: start,
        };
        let limits = DecodeLimits {
            output: containers.config.sandbox.output_limit_bytes,
            content: 0,
            entries: 0,
        };
        match sbox
            .ask(open.encode(), limits, start + BACKSTOP_GRACE, None, None)
            .await
        {
            Ok(x) => match (x.decoded.fatal, x.decoded.done) {
                (Some(fatal), _) => Err(SandboxFailure::InitFatal(fatal)),
                (None, Some(Done { error: None, .. })) => Ok(sbox),
                (None, Some(Done { error: Some(e), .. })) => Err(SandboxFailure::OpenRefused(e)),
                (None, None) => Err(SandboxFailure::NotOpened),
            },
            Err(broken) => Err(SandboxFailure::OpenBroken(broken)),
        }
    }

    /// Carry out one execution of the session. Never fails: the report says what happened,
    /// and [`SessionRun::broken`] whether the session's container is gone.
    pub(super) async fn execute(
        &self,
        stages: Stages<'_>,
        session: SessionExecution,
        call: Call<'_>,
    ) -> SessionRun {
        let started = Instant::now();
        let (run_id, req, queued_ms) = (call.run_id, call.req, call.queued_ms);
        let bound = call.bound(&stages.containers.config);
        let mut known = Known::default();
        let mut broken = None;
        let mut workspace_bytes = None;
        let mut state = (InterpreterState::Kept, None);
        // Packages first: the program then sees them where its environment points.
        let with_env;
        let req = match &self.packages {
            Some(p) => {
                let mut r = req.clone();
                r.language.env.extend(p.env().clone());
                with_env = r;
                &with_env
            }
            None => req,
        };
        let installed = if req.packages.is_empty() {
            Ok(())
        } else {
            self.install(stages, run_id, req, &mut known, bound).await
        };
        let ended = match installed {
            Err(end) => Ended::AtInstall(end),
            Ok(()) => match prepare_execution(
                stages,
                run_id,
                req,
                session.execution_count,
                &mut known,
                bound,
            )
            .await
            {
                Err(Halt::Stopped) => Ended::Stopped,
                Err(Halt::Failed(f)) => Ended::Failed(f),
                Ok(Err(end)) => Ended::AtCompile(end),
                Ok(Ok(exec)) => {
                    known.stage = Some(Stage::Run);
                    let backstop = SESSION_TIMES.exec_answer(exec.check_timeout, exec.timeout)
                        + BACKSTOP_GRACE;
                    let s = &stages.containers.config.sandbox;
                    let limits = DecodeLimits {
                        output: s.output_limit_bytes,
                        content: s.max_output_bytes,
                        entries: super::containers::MAX_OUTPUT_ENTRIES,
                    };
                    let live = bound.feed.map(|feed| feed.pen(None));
                    if let Some(feed) = bound.feed {
                        feed.started(Stage::Run);
                    }
                    match self
                        .ask(exec.encode(), limits, backstop, Some(bound.cancel), live)
                        .await
                    {
                        Ok(x) if x.closed => {
                            state = (InterpreterState::Reset, Some(ResetReason::Stopped));
                            session_ended(req, &mut known, x, Done::default())
                        }
                        Ok(x) => {
                            let done = x.decoded.done.clone().unwrap_or_default();
                            workspace_bytes = done.workspace_bytes;
                            if let Some(s) = done.state {
                                state = (s, done.reason);
                            }
                            session_ended(req, &mut known, x, done)
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
                                Broken::Failed(why) => {
                                    Ended::Failed(SandboxFailure::SessionBroke(why.clone()))
                                }
                            };
                            broken = Some(b);
                            ended
                        }
                    }
                }
            },
        };
        let mut report = report(run_id, req, known, ended);
        report.queued_ms = queued_ms;
        report.duration_ms = started.elapsed().as_millis() as u64;
        report.session = Some(SessionExecution {
            state: if self.stateful {
                state.0
            } else {
                files_only_state(&session)
            },
            reset_reason: if self.stateful { state.1 } else { None },
            ..session
        });
        SessionRun {
            report,
            broken,
            workspace_bytes,
        }
    }

    /// Install `req.packages` into the session's volume (SPEC 13) before its execution.
    async fn install(
        &self,
        stages: Stages<'_>,
        run_id: &str,
        req: &ValidRequest,
        known: &mut Known,
        bound: Bound<'_>,
    ) -> Result<(), InstallEnd> {
        known.stage = Some(Stage::Install);
        let Some(p) = &self.packages else {
            return Err(InstallFailure::NoVolume {
                language: req.language.id.clone(),
            }
            .into());
        };
        let report = p
            .add(
                stages.packages,
                run_id,
                &req.language,
                &self.image_id,
                &req.packages,
                bound,
            )
            .await?;
        known.packages = Some(report);
        Ok(())
    }

    /// Read a file or folder of the session's working directory without running anything.
    pub(super) async fn read(
        &self,
        config: &Config,
        path: &str,
        offset: u64,
        max_bytes: u64,
    ) -> Result<FileRead, ReadError> {
        let limits = DecodeLimits {
            output: config.sandbox.output_limit_bytes,
            content: max_bytes,
            entries: 10_000,
        };
        let read = Read {
            path: path.to_string(),
            offset,
            max_bytes,
        };
        let x = self
            .ask(read.encode(), limits, READ_TIMEOUT, None, None)
            .await
            .map_err(ReadError::Broken)?;
        match x.decoded.done.as_ref().and_then(|d| d.error.clone()) {
            Some(error) => Err(ReadError::Refused(error)),
            None => Ok(FileRead { decoded: x.decoded }),
        }
    }
}

/// The execution request: compiled first where the language compiles (in a compile
/// container of its own, the cache included), or how the run ends before it.
async fn prepare_execution(
    stages: Stages<'_>,
    run_id: &str,
    req: &ValidRequest,
    execution_count: u64,
    known: &mut Known,
    bound: Bound<'_>,
) -> Result<Result<Exec, CompileEnd>, Halt> {
    let lang = &req.language;
    let s = &stages.containers.config.sandbox;
    let request_files = || -> Vec<Entry> {
        req.files
            .iter()
            .map(|(path, content)| Entry::file(path.clone(), 0o644, content.clone()))
            .collect()
    };
    let mut run = lang.run.clone();
    run.extend(req.args.iter().cloned());
    let (work, files, check_timeout) = if lang.is_compiled() {
        match stages
            .compiler
            .compile_cached(stages.containers, run_id, req, known, bound)
            .await?
        {
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
            Files::new(&sources(req)),
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
        interrupt: SESSION_TIMES.interrupt,
        execution_count,
    }))
}

/// How an execution's frames end the run.
fn session_ended(req: &ValidRequest, known: &mut Known, x: Heard, done: Done) -> Ended {
    if let Some(error) = done.error {
        return Ended::Failed(SandboxFailure::ExecutionRefused(error));
    }
    let result = Answer {
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
    if let Some(end) = check_failed(&result, &req.language, known, req.limits.memory_mb) {
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

/// A files-only session's interpreter state: `new` for its first execution, then `kept`.
fn files_only_state(session: &SessionExecution) -> InterpreterState {
    if session.execution_count <= 1 {
        InterpreterState::New
    } else {
        InterpreterState::Kept
    }
}
