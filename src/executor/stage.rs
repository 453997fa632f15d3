//! One stage in one container, engine-neutral: attach, start (unless it was started ahead of
//! time), then the exchange with `codebox-init` ([`super::exchange`]), then the container's
//! exit and state where its report is not whole.
//!
//! `codebox-init` enforces the program's wall-clock limit itself (so a timed-out program still
//! reports its usage and files). The host only steps in when the helper does not finish: at
//! `backstop` it kills the container. A stop asks the helper first (SIGTERM: it stops the
//! program and reports), then kills after [`STOP_GRACE`]. When `codebox-init` reported
//! everything (its end frame, each phase's OOM kills), the engine is not asked for the exit
//! code or the container's state at all. Before the container runs, attaching and starting it
//! are bounded the same way as every other engine call of a run: by a stop and by the run's
//! deadline ([`Bound`]). Tested on the fake engine with paused time.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::exchange::{by, write_request, Exchange, StopRule, Until, WAIT_GRACE};
pub use super::exchange::{HostEnding, END_GRACE, STOP_GRACE};

/// How long the host waits beyond a stage's own limits before it kills the container
/// (`codebox-init` enforces the limits; this is the backstop), whatever the stage.
pub(super) const BACKSTOP_GRACE: Duration = Duration::from_secs(5);
use crate::engine::protocol::{DecodeLimits, Decoded};
use crate::engine::{ContainerEngine, EngineError, InputSink, Signal};
use crate::live::Feed;
use crate::report::Stage;

/// What a run's stages answer to: a stop or the run's deadline ends an engine call before it
/// answers, and its live feed, when someone may watch, sees the stages as they go.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    pub cancel: &'a CancellationToken,
    pub deadline: Instant,
    pub feed: Option<&'a Arc<Feed>>,
    /// The test case it runs (1-based) when several run at once: its live output says so.
    pub case: Option<u32>,
}

impl<'a> Bound<'a> {
    /// Bounded by `cancel` and `deadline`, shown to nobody.
    pub fn new(cancel: &'a CancellationToken, deadline: Instant) -> Bound<'a> {
        Bound {
            cancel,
            deadline,
            feed: None,
            case: None,
        }
    }
}

/// Why a run's engine call was given up.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Interrupted {
    #[error("stopped")]
    Stopped,
    /// The run's deadline passed while the engine had not answered.
    #[error(
        "Docker did not finish {step} within the run's time limit; the container is being removed"
    )]
    Late { step: &'static str },
}

/// What an engine call bounded by a stop and a deadline came to.
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Interrupted(#[from] Interrupted),
}

impl Bound<'_> {
    /// `call`, unless a stop or the deadline comes first. `step` names it for the error
    /// ("creating the container").
    pub async fn call<T>(
        &self,
        step: &'static str,
        call: impl std::future::Future<Output = Result<T, EngineError>>,
    ) -> Result<T, BoundError> {
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(Interrupted::Stopped.into()),
            answer = tokio::time::timeout_at(self.deadline, call) => match answer {
                Ok(result) => Ok(result?),
                Err(_) => Err(Interrupted::Late { step }.into()),
            },
        }
    }
}

/// What to do in one container.
#[derive(Clone)]
pub(crate) struct StageRequest {
    /// The payload for the container's stdin, in parts written one after the other.
    pub payload: Vec<bytes::Bytes>,
    /// After this long the host kills the container, whatever the helper says.
    pub backstop: Duration,
    /// When a check phase comes first (its budget is in `backstop`): once the run phase
    /// begins, the host's deadline becomes this long from then, if that is sooner.
    pub run_backstop: Option<Duration>,
    pub limits: DecodeLimits,
    /// Where the stage is shown as it goes, when someone may watch.
    pub live: Option<LiveStage>,
}

/// A stage shown live: its feed, and which stage it is (a run stage shows its files and
/// takes the program's stdin from the feed when it has one).
#[derive(Clone)]
pub(crate) struct LiveStage {
    pub feed: Arc<Feed>,
    pub stage: Stage,
    /// The test case it runs, when several run at once.
    pub case: Option<u32>,
}

/// Where a stage's time went, as the host saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimes {
    /// Attaching, and starting the container if it was only created.
    pub deliver: Duration,
    /// From then to the end of the container's output.
    pub run: Duration,
    /// Waiting for its exit and reading its state.
    pub collect: Duration,
}

/// What one stage's container answered, as the host saw it.
#[derive(Debug)]
pub struct Answer {
    pub decoded: Decoded,
    /// The stream broke the protocol (the rest was ignored and the container killed).
    pub protocol_error: Option<String>,
    /// The attach stream failed (the connection to the engine was lost).
    pub stream_error: Option<EngineError>,
    /// What the container wrote on its own stderr.
    pub stderr: Vec<u8>,
    pub host_ending: HostEnding,
    pub exit_code: Option<i64>,
    pub oom_killed: bool,
    pub image_id: Option<String>,
    pub duration: Duration,
    pub times: StageTimes,
}

/// Pass the program's stdin on as it comes, until its sender closes (the program then
/// reads its end). The lock is held while forwarding: a stage that is given up (a container
/// that never answered) leaves the rest to the next.
async fn forward_stdin(
    input: &mut InputSink,
    stdin: &tokio::sync::Mutex<tokio::sync::mpsc::Receiver<bytes::Bytes>>,
) {
    use tokio::io::AsyncWriteExt;
    let mut rx = stdin.lock().await;
    while let Some(chunk) = rx.recv().await {
        if input.write_all(&chunk).await.is_err() || input.flush().await.is_err() {
            return;
        }
    }
}

/// Run one stage in the container `id`; `start` when it was only created. Attaching and
/// starting are bounded by `bound`; once the container runs, the stage's own deadlines apply.
pub(crate) async fn run_stage(
    engine: &dyn ContainerEngine,
    id: &str,
    start: bool,
    request: StageRequest,
    bound: Bound<'_>,
) -> Result<Answer, BoundError> {
    let cancel = bound.cancel;
    let asked = Instant::now();
    let attached = bound
        .call("attaching to the container", engine.attach_container(id))
        .await?;
    if start {
        bound
            .call("starting the container", engine.start_container(id))
            .await?;
    }
    let began = Instant::now();
    let mut input = attached.input;
    let payload = request.payload;
    let live = request.live;
    if let Some(l) = &live {
        l.feed.started(l.stage);
    }
    let stdin = live
        .as_ref()
        .filter(|l| l.stage == Stage::Run)
        .and_then(|l| l.feed.stdin());
    // The payload may be larger than a pipe holds: it is written while the output is read.
    // The task holds the attach connection's write half until the stage ends, whichever way
    // it ends: dropping the handle aborts it.
    let _writer = AbortOnDropHandle::new(tokio::spawn(async move {
        if write_request(&mut input, payload).await.is_ok() {
            if let Some(stdin) = stdin {
                forward_stdin(&mut input, &stdin).await;
            }
        }
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut input).await;
        std::future::pending::<()>().await;
    }));
    let mut output = attached.output;
    let stop = StopRule {
        grace: STOP_GRACE,
        repeat: None,
    };
    let mut ex = Exchange::new(
        engine,
        id,
        request.limits,
        request.backstop,
        stop,
        Until::OutputEnds,
    )
    .with_run_backstop(request.run_backstop)
    .with_live(
        live.as_ref().map(|l| l.feed.pen(l.case)),
        live.as_ref().is_some_and(|l| l.stage == Stage::Run),
    );
    ex.listen(&mut output, cancel, &CancellationToken::new())
        .await?;
    let output_ended = Instant::now();
    let (exit_code, oom_killed, image_id) = if ex.whole() {
        // codebox-init exits 0 after its end frame; removal ends whatever is left.
        (Some(0), false, None)
    } else {
        let mut exit_code = None;
        if !ex.unresponsive {
            let collect_by = (Instant::now() + WAIT_GRACE).min(ex.hard_end);
            match by(collect_by, engine.wait_container(id)).await {
                Some(code) => exit_code = Some(code?),
                // Still running after its output ended: end it, and read its exit from inspect.
                None => match by(ex.hard_end, engine.kill_container(id, Signal::Kill)).await {
                    Some(killed) => killed?,
                    None => ex.unresponsive = true,
                },
            }
        }
        let state = match ex.inspect().await {
            Some(state) => state?,
            None => {
                ex.stream_error = ex.stream_error.take().or(Some(EngineError::Unresponsive {
                    seconds: END_GRACE.as_secs(),
                }));
                Default::default()
            }
        };
        let exit_code = exit_code.or(state.exit_code);
        let oom = ex.out_of_memory(&state, exit_code).await;
        (exit_code, oom, state.image_id)
    };
    Ok(Answer {
        protocol_error: ex.protocol_error.take(),
        stream_error: ex.stream_error.take(),
        stderr: std::mem::take(&mut ex.stderr),
        host_ending: ex.ending,
        decoded: ex.into_decoded(),
        exit_code,
        oom_killed,
        image_id,
        duration: began.elapsed(),
        times: StageTimes {
            deliver: began - asked,
            run: output_ended - began,
            collect: output_ended.elapsed(),
        },
    })
}
