//! One stage in one container, engine-neutral: attach, start (unless it was started ahead of
//! time), write the payload, decode what `codebox-init` sends back, and enforce the host's
//! own deadline and stop on top of the helper's.
//!
//! `codebox-init` enforces the program's wall-clock limit itself (so a timed-out program still
//! reports its usage and files). The host only steps in when the helper does not finish: at
//! `backstop` it kills the container. A stop asks the helper first (SIGTERM: it stops the
//! program and reports), then kills after [`STOP_GRACE`]. Once the stage's time is up, the
//! host waits on the engine (kill, drain, exit, state) for at most [`END_GRACE`] more: a
//! daemon that stops answering cannot hold a run beyond its limits, the backstop's grace and
//! this. When `codebox-init` reported everything (its end frame, each phase's OOM kills), the
//! engine is not asked for the exit code or the container's state at all. Before the
//! container runs, attaching and starting it are bounded the same way as every other engine
//! call of a run: by a stop and by the run's deadline ([`Bound`]). Tested on the fake engine
//! with paused time.

use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::engine::protocol::{DecodeLimits, Decoded, Decoder, PhaseName};
use crate::engine::{ContainerEngine, EngineError, Output, Signal};

/// How long a stopped helper gets to report before the container is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long output may keep arriving after a kill.
pub const DRAIN_GRACE: Duration = Duration::from_secs(3);
/// How long to wait for the engine to report a container's exit.
pub const WAIT_GRACE: Duration = Duration::from_secs(10);
/// How long the host goes on waiting for the engine once the stage's time is up (the
/// backstop passed, or a stop's grace): after this the stage ends without the engine's word.
pub const END_GRACE: Duration = Duration::from_secs(10);
/// How long a container that died of a SIGKILL nobody explains is watched for the engine's
/// record of an OOM kill, which can come after the exit.
pub const OOM_RECORD_GRACE: Duration = Duration::from_secs(2);
/// Bytes kept of what the container writes to its own stderr (only `codebox-init` may, and
/// only when it cannot start at all).
const STDERR_KEPT: usize = 16 * 1024;

/// What ends an engine call of a run before it answers: a stop, or the run's deadline.
#[derive(Clone, Copy)]
pub struct Bound<'a> {
    pub cancel: &'a CancellationToken,
    pub deadline: Instant,
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
pub struct StageRequest {
    /// The payload for the container's stdin, in parts written one after the other.
    pub payload: Vec<bytes::Bytes>,
    /// After this long the host kills the container, whatever the helper says.
    pub backstop: Duration,
    /// When a check phase comes first (its budget is in `backstop`): once the run phase
    /// begins, the host's deadline becomes this long from then, if that is sooner.
    pub run_backstop: Option<Duration>,
    pub limits: DecodeLimits,
}

/// How the host saw the stage end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnding {
    /// The container finished by itself.
    Finished,
    /// The host's deadline passed and the container was killed.
    Backstop,
    /// A stop was asked for.
    Stopped,
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

/// What one stage produced.
#[derive(Debug)]
pub struct StageResult {
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

/// Where the loop stands: each state has its own deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Watch {
    Running,
    Stopping,
    Killed,
}

/// An engine call that must answer by `when`; `None` when it did not.
async fn by<T>(when: Instant, call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout_at(when, call).await.ok()
}

/// Parts written whole up to this size; larger ones (shared files) are not copied.
const COALESCE_BYTES: usize = 1 << 20;

/// `parts` in as few writes as possible without copying a large part: each write is a
/// message through the daemon's attach stream to the container's stdin, and a payload in one
/// write reaches `codebox-init` in one read.
fn coalesce(parts: Vec<bytes::Bytes>) -> Vec<bytes::Bytes> {
    let mut out = Vec::with_capacity(parts.len());
    let mut joined = bytes::BytesMut::new();
    for part in parts {
        if part.len() > COALESCE_BYTES {
            if !joined.is_empty() {
                out.push(joined.split().freeze());
            }
            out.push(part);
        } else {
            if joined.len() + part.len() > COALESCE_BYTES {
                out.push(joined.split().freeze());
            }
            joined.extend_from_slice(&part);
        }
    }
    if !joined.is_empty() {
        out.push(joined.freeze());
    }
    out
}

/// Run one stage in the container `id`; `start` when it was only created. Attaching and
/// starting are bounded by `bound`; once the container runs, the stage's own deadlines apply.
pub async fn run_stage(
    engine: &dyn ContainerEngine,
    id: &str,
    start: bool,
    request: StageRequest,
    bound: Bound<'_>,
) -> Result<StageResult, BoundError> {
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
    let payload = coalesce(request.payload);
    // The payload may be larger than a pipe holds: it is written while the output is read.
    // The task holds the attach connection's write half until the stage ends, whichever way
    // it ends: dropping the handle aborts it.
    let _writer = AbortOnDropHandle::new(tokio::spawn(async move {
        for part in payload {
            if input.write_all(&part).await.is_err() {
                break;
            }
        }
        let _ = input.shutdown().await;
        std::future::pending::<()>().await;
    }));
    let mut output = attached.output;
    let mut decoder = Decoder::new(request.limits);
    let mut stderr = Vec::new();
    let mut protocol_error = None;
    let mut stream_error = None;
    let mut ending = HostEnding::Finished;
    let mut watch = Watch::Running;
    let mut deadline = began + request.backstop;
    // Past this the engine's answers are no longer waited for.
    let mut hard_end = deadline + END_GRACE;
    let mut stop_asked = false;
    let mut unresponsive = false;
    let mut run_backstop = request.run_backstop;
    loop {
        tokio::select! {
            item = output.next() => match item {
                Some(Ok(Output::Stdout(bytes))) => {
                    if protocol_error.is_none() {
                        let pushed = decoder.push(&bytes);
                        if let Some(after) = run_backstop.filter(|_| watch == Watch::Running && decoder.decoded().phase(PhaseName::Run).is_some()) {
                            run_backstop = None;
                            deadline = deadline.min(Instant::now() + after);
                            hard_end = hard_end.min(deadline + END_GRACE);
                        }
                        if let Err(e) = pushed {
                            protocol_error = Some(e.to_string());
                            let Some(killed) = by(hard_end, engine.kill_container(id, Signal::Kill)).await else {
                                unresponsive = true;
                                break;
                            };
                            killed?;
                            watch = Watch::Killed;
                            deadline = (Instant::now() + DRAIN_GRACE).min(hard_end);
                        }
                    }
                }
                Some(Ok(Output::Stderr(bytes))) => {
                    let room = STDERR_KEPT.saturating_sub(stderr.len());
                    stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                }
                Some(Err(e)) => {
                    stream_error = Some(e);
                    break;
                }
                None => break,
            },
            _ = cancel.cancelled(), if !stop_asked && watch == Watch::Running => {
                stop_asked = true;
                ending = HostEnding::Stopped;
                hard_end = hard_end.min(Instant::now() + STOP_GRACE + END_GRACE);
                let Some(signalled) = by(hard_end, engine.kill_container(id, Signal::Term)).await else {
                    unresponsive = true;
                    break;
                };
                signalled?;
                watch = Watch::Stopping;
                deadline = Instant::now() + STOP_GRACE;
            }
            _ = tokio::time::sleep_until(deadline) => match watch {
                Watch::Running | Watch::Stopping => {
                    if watch == Watch::Running {
                        ending = HostEnding::Backstop;
                    }
                    let Some(killed) = by(hard_end, engine.kill_container(id, Signal::Kill)).await else {
                        unresponsive = true;
                        break;
                    };
                    killed?;
                    watch = Watch::Killed;
                    deadline = (Instant::now() + DRAIN_GRACE).min(hard_end);
                }
                Watch::Killed => break,
            },
        }
    }
    let output_ended = Instant::now();
    // codebox-init reported to its end, with every phase's OOM kills, and nothing else
    // happened: the outcome needs neither the engine's exit code (codebox-init exits 0 after
    // its end frame) nor the container's state; removal ends whatever is left.
    let whole = watch == Watch::Running
        && ending == HostEnding::Finished
        && protocol_error.is_none()
        && stream_error.is_none()
        && {
            let d = decoder.decoded();
            d.complete
                && d.fatal.is_none()
                && d.phases
                    .iter()
                    .all(|p| p.end.as_ref().is_some_and(|e| e.oom_kills.is_some()))
        };
    let (decoded, exit_code, oom_killed, image_id) = if whole {
        (decoder.finish(), Some(0), false, None)
    } else {
        // Reading the exit and the state: each within WAIT_GRACE, and never past `hard_end`.
        let collect_by = || (Instant::now() + WAIT_GRACE).min(hard_end);
        let mut exit_code = None;
        if !unresponsive {
            match by(collect_by(), engine.wait_container(id)).await {
                Some(code) => exit_code = Some(code?),
                // Still running after its output ended: end it, and read its exit from inspect.
                None => match by(hard_end, engine.kill_container(id, Signal::Kill)).await {
                    Some(killed) => killed?,
                    None => unresponsive = true,
                },
            }
        }
        let state = if unresponsive {
            None
        } else {
            by(collect_by(), engine.inspect_container(id)).await
        };
        let mut state = match state {
            Some(state) => state?,
            None => {
                stream_error = stream_error.or(Some(EngineError::Unresponsive {
                    seconds: END_GRACE.as_secs(),
                }));
                Default::default()
            }
        };
        let decoded = decoder.finish();
        let exit_code = exit_code.or(state.exit_code);
        // PID 1 died of SIGKILL, codebox-init said nothing, and the host killed nobody: the OOM
        // killer is the likely cause (under gVisor it takes codebox-init with the program), and
        // Docker records it when its OOM event arrives, which can be after the exit event.
        if exit_code == Some(137)
            && !state.oom_killed
            && !decoded.complete
            && watch == Watch::Running
            && stream_error.is_none()
        {
            let until = (Instant::now() + OOM_RECORD_GRACE).min(hard_end);
            state.oom_killed = matches!(by(until, engine.oom_event(id)).await, Some(Ok(true)));
        }
        (decoded, exit_code, state.oom_killed, state.image_id)
    };
    Ok(StageResult {
        decoded,
        protocol_error,
        stream_error,
        stderr,
        host_ending: ending,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_go_in_one_write_and_large_ones_are_not_copied() {
        let big = bytes::Bytes::from(vec![7u8; COALESCE_BYTES + 1]);
        let parts = vec![
            bytes::Bytes::from_static(b"head"),
            bytes::Bytes::from_static(b"files"),
            big.clone(),
            bytes::Bytes::from_static(b"end"),
            bytes::Bytes::from_static(b"stdin"),
        ];
        let out = coalesce(parts);
        assert_eq!(out.len(), 3);
        assert_eq!(&out[0][..], b"headfiles");
        assert_eq!(
            out[1].as_ptr(),
            big.as_ptr(),
            "the large part is the same buffer"
        );
        assert_eq!(&out[2][..], b"endstdin");
    }
}
