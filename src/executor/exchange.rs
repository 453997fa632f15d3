//! The one exchange with `codebox-init`, whoever asks (a one-shot stage, a session's request):
//! write a request whole, decode the frames that answer it, ask for a stop (SIGTERM, again if
//! asked for), kill at the deadline and drain what is left, and the rule for when a SIGKILL
//! nobody explains counts as an out-of-memory kill.
//!
//! A request is never abandoned once its first byte is written: a stop is signalled while it
//! is written, and `codebox-init` answers it once it has read the whole request. The host's
//! deadlines are backstops: past the deadline the container is killed and what it still sends
//! is read for `DRAIN_GRACE`; once the exchange's time is up the engine is waited for at
//! most [`END_GRACE`] more.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::live::{Pen, Stream};

use crate::engine::protocol::{DecodeLimits, Decoded, Decoder, News, PhaseName};
use crate::engine::{
    ContainerEngine, ContainerState, EngineError, InputSink, Output, OutputStream, Signal,
};

/// How long a stopped one-shot stage's helper gets to report before the container is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long output may keep arriving after a kill.
const DRAIN_GRACE: Duration = Duration::from_secs(3);
/// How long to wait for the engine to report a container's exit or state.
pub(super) const WAIT_GRACE: Duration = Duration::from_secs(10);
/// How long the host goes on waiting for the engine once the exchange's time is up (the
/// backstop passed, or a stop's grace): after this it ends without the engine's word.
pub const END_GRACE: Duration = Duration::from_secs(10);
/// How long a container that died of a SIGKILL nobody explains is watched for the engine's
/// record of an OOM kill, which can come after the exit.
const OOM_RECORD_GRACE: Duration = Duration::from_secs(2);
/// Bytes kept of what the container writes to its own stderr (only `codebox-init` may, and
/// only when it cannot start at all).
const STDERR_KEPT: usize = 16 * 1024;
/// Parts written whole up to this size; larger ones (shared files) are not copied.
const COALESCE_BYTES: usize = 1 << 20;

/// `parts` in as few writes as possible without copying a large part: each write is a
/// message through the daemon's attach stream to the container's stdin, and a request in one
/// write reaches `codebox-init` in one read.
fn coalesce(parts: Vec<Bytes>) -> Vec<Bytes> {
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

/// Write a request whole: every part in order, then flush.
pub(super) async fn write_request(input: &mut InputSink, parts: Vec<Bytes>) -> std::io::Result<()> {
    for part in coalesce(parts) {
        input.write_all(&part).await?;
    }
    input.flush().await
}

/// How the host saw the exchange end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEnding {
    /// The container answered (or finished) by itself.
    Finished,
    /// The host's deadline passed and the container was killed.
    Backstop,
    /// A stop was asked for.
    Stopped,
}

/// How a stop is asked for, and how long its answer may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct StopRule {
    /// The container is killed this long after the stop, unanswered.
    pub grace: Duration,
    /// SIGTERM again this often until the answer: a session's `codebox-init` drops a SIGTERM
    /// that reaches it before the request's first byte.
    pub repeat: Option<Duration>,
}

/// What ends the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// The container's output ends (a one-shot stage: `Z`, then the exit).
    OutputEnds,
    /// The request's `D` (or a fatal `!`): a session's container goes on.
    Answered,
}

/// Where the exchange stands: each state has its own deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    Running,
    Stopping,
    Killed,
}

/// An engine call that must answer by `when`; `None` when it did not.
pub async fn by<T>(when: Instant, call: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout_at(when, call).await.ok()
}

/// One request's answer being read from one container, with the host's rules on top.
pub(super) struct Exchange<'a> {
    engine: &'a dyn ContainerEngine,
    id: &'a str,
    decoder: Decoder,
    stop: StopRule,
    until: Until,
    /// When a check phase comes first: once the run phase begins, the deadline becomes this
    /// long from then, if that is sooner.
    run_backstop: Option<Duration>,
    pub watch: Watch,
    pub ending: HostEnding,
    deadline: Instant,
    /// Past this the engine's answers are no longer waited for.
    pub hard_end: Instant,
    /// What the container wrote on its own stderr.
    pub stderr: Vec<u8>,
    /// The stream broke the protocol (the rest was ignored and the container killed).
    pub protocol_error: Option<String>,
    /// The attach stream failed (the connection to the engine was lost).
    pub stream_error: Option<EngineError>,
    /// The engine did not answer a kill in time.
    pub unresponsive: bool,
    /// The container's owner ended it while the answer was awaited.
    pub closed: bool,
    /// Where what arrives is shown while it arrives.
    live: Option<Pen>,
    /// Whether file entries are shown (a run stage's `outputs/`, not a compile's artifacts).
    live_files: bool,
    output_limit: u64,
}

impl<'a> Exchange<'a> {
    /// An exchange with container `id` whose answer must come within `backstop` from now.
    pub fn new(
        engine: &'a dyn ContainerEngine,
        id: &'a str,
        limits: DecodeLimits,
        backstop: Duration,
        stop: StopRule,
        until: Until,
    ) -> Exchange<'a> {
        let deadline = Instant::now() + backstop;
        Exchange {
            engine,
            id,
            decoder: Decoder::new(limits),
            stop,
            until,
            run_backstop: None,
            watch: Watch::Running,
            ending: HostEnding::Finished,
            deadline,
            hard_end: deadline + END_GRACE,
            stderr: Vec::new(),
            protocol_error: None,
            stream_error: None,
            unresponsive: false,
            closed: false,
            live: None,
            live_files: false,
            output_limit: limits.output,
        }
    }

    /// Show the output (and the files, when `files`) with `pen` as they arrive.
    pub(super) fn with_live(mut self, pen: Option<Pen>, files: bool) -> Exchange<'a> {
        self.live_files = files;
        if pen.is_some() {
            self.decoder.keep_news();
        }
        self.live = pen;
        self
    }

    /// Pass on what the last frames brought.
    fn tell(&mut self) {
        let Some(feed) = &mut self.live else { return };
        for news in self.decoder.take_news() {
            let stream = |stdout| {
                if stdout {
                    Stream::Stdout
                } else {
                    Stream::Stderr
                }
            };
            match news {
                News::Output { stdout, bytes } => feed.output(stream(stdout), &bytes),
                News::Capped { stdout } => feed.truncated(stream(stdout), self.output_limit),
                News::File { path, size } if self.live_files => feed.file(&path, size),
                News::File { .. } => {}
            }
        }
    }

    pub(super) fn with_run_backstop(mut self, after: Option<Duration>) -> Exchange<'a> {
        self.run_backstop = after;
        self
    }

    pub(crate) fn decoded(&self) -> &Decoded {
        self.decoder.decoded()
    }

    /// The request was answered: its end frame, or a fatal error.
    pub fn answered(&self) -> bool {
        let d = self.decoder.decoded();
        d.complete || d.fatal.is_some()
    }

    pub(super) fn into_decoded(self) -> Decoded {
        self.decoder.finish()
    }

    /// Kill the container, within `hard_end`; then drain its output for a while.
    async fn kill(&mut self) -> Result<bool, EngineError> {
        let Some(killed) = by(
            self.hard_end,
            self.engine.kill_container(self.id, Signal::Kill),
        )
        .await
        else {
            self.unresponsive = true;
            return Ok(false);
        };
        killed?;
        self.watch = Watch::Killed;
        self.deadline = (Instant::now() + DRAIN_GRACE).min(self.hard_end);
        Ok(true)
    }

    /// Read the answer until [`Until`] says it is over, the deadline's kill and drain end it,
    /// or `closed` (the container's owner removed it). `stop` asks for a stop.
    pub async fn listen(
        &mut self,
        output: &mut OutputStream,
        stop: &CancellationToken,
        closed: &CancellationToken,
    ) -> Result<(), EngineError> {
        let mut again =
            tokio::time::interval(self.stop.repeat.unwrap_or(Duration::from_secs(3600)));
        let mut stop_asked = false;
        loop {
            if self.until == Until::Answered && self.answered() {
                return Ok(());
            }
            tokio::select! {
                _ = closed.cancelled() => {
                    self.closed = true;
                    self.ending = HostEnding::Stopped;
                    return Ok(());
                }
                item = output.next() => match item {
                    Some(Ok(Output::Stdout(bytes))) => {
                        if self.protocol_error.is_some() {
                            continue;
                        }
                        let pushed = self.decoder.push(&bytes);
                        self.tell();
                        if let Some(after) = self.run_backstop.filter(|_| {
                            self.watch == Watch::Running
                                && self.decoder.decoded().phase(PhaseName::Run).is_some()
                        }) {
                            self.run_backstop = None;
                            self.deadline = self.deadline.min(Instant::now() + after);
                            self.hard_end = self.hard_end.min(self.deadline + END_GRACE);
                        }
                        if let Err(e) = pushed {
                            self.protocol_error = Some(e.to_string());
                            if !self.kill().await? {
                                return Ok(());
                            }
                        }
                    }
                    Some(Ok(Output::Stderr(bytes))) => {
                        let room = STDERR_KEPT.saturating_sub(self.stderr.len());
                        self.stderr.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    }
                    Some(Err(e)) => {
                        self.stream_error = Some(e);
                        return Ok(());
                    }
                    None => return Ok(()),
                },
                _ = stop.cancelled(), if !stop_asked && self.watch == Watch::Running => {
                    stop_asked = true;
                    self.ending = HostEnding::Stopped;
                    self.hard_end = self.hard_end.min(Instant::now() + self.stop.grace + END_GRACE);
                    let Some(signalled) = by(self.hard_end, self.engine.kill_container(self.id, Signal::Term)).await else {
                        self.unresponsive = true;
                        return Ok(());
                    };
                    signalled?;
                    self.watch = Watch::Stopping;
                    self.deadline = Instant::now() + self.stop.grace;
                    again.reset();
                }
                _ = again.tick(), if self.watch == Watch::Stopping && self.stop.repeat.is_some() => {
                    let Some(signalled) = by(self.hard_end, self.engine.kill_container(self.id, Signal::Term)).await else {
                        self.unresponsive = true;
                        return Ok(());
                    };
                    signalled?;
                }
                _ = tokio::time::sleep_until(self.deadline) => match self.watch {
                    Watch::Running | Watch::Stopping => {
                        if self.watch == Watch::Running {
                            self.ending = HostEnding::Backstop;
                        }
                        if !self.kill().await? {
                            return Ok(());
                        }
                    }
                    Watch::Killed => return Ok(()),
                },
            }
        }
    }

    /// `codebox-init` reported to its end, with every phase's OOM kills, and nothing else
    /// happened: the outcome needs neither the engine's exit code nor the container's state.
    pub fn whole(&self) -> bool {
        let d = self.decoder.decoded();
        self.watch == Watch::Running
            && self.ending == HostEnding::Finished
            && self.protocol_error.is_none()
            && self.stream_error.is_none()
            && d.complete
            && d.fatal.is_none()
            && d.phases
                .iter()
                .all(|p| p.end.as_ref().is_some_and(|e| e.oom_kills.is_some()))
    }

    /// The container's state, within [`WAIT_GRACE`] and `hard_end`; `None` when the engine
    /// did not answer in time.
    pub async fn inspect(&self) -> Option<Result<ContainerState, EngineError>> {
        if self.unresponsive {
            return None;
        }
        let until = (Instant::now() + WAIT_GRACE).min(self.hard_end);
        by(until, self.engine.inspect_container(self.id)).await
    }

    /// Whether the container died of an out-of-memory kill: the engine says so, or PID 1 died
    /// of a SIGKILL (137) that nobody explains (`codebox-init` said nothing, the host killed
    /// nobody, the stream did not break) and the engine records an OOM event, which can come
    /// after the exit. Under gVisor an OOM kill takes `codebox-init` with the program.
    pub async fn out_of_memory(&self, state: &ContainerState, exit_code: Option<i64>) -> bool {
        if state.oom_killed {
            return true;
        }
        if exit_code != Some(137)
            || self.decoder.decoded().complete
            || self.watch != Watch::Running
            || self.stream_error.is_some()
        {
            return false;
        }
        let until = (Instant::now() + OOM_RECORD_GRACE).min(self.hard_end);
        matches!(
            by(until, self.engine.oom_event(self.id)).await,
            Some(Ok(true))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_parts_go_in_one_write_and_large_ones_are_not_copied() {
        let big = Bytes::from(vec![7u8; COALESCE_BYTES + 1]);
        let parts = vec![
            Bytes::from_static(b"head"),
            Bytes::from_static(b"files"),
            big.clone(),
            Bytes::from_static(b"end"),
            Bytes::from_static(b"stdin"),
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
