//! Piston's WebSocket, `GET /api/v2/connect`: an interactive run. Messages are JSON text, as
//! Piston defines them:
//! - the client's first message, within a second, is `init` with `/api/v2/execute`'s fields;
//!   the server answers `runtime {language, version}`, then `stage {stage}` as each stage
//!   starts, `data {stream: "stdout"|"stderr", data}` as the program writes, and `exit
//!   {stage, code, signal}` when a stage ends; then it closes with 4999 "Job Completed";
//! - `data {stream: "stdin", data}` goes to the program's stdin while it runs;
//! - `signal {signal}` (a signal name, `SIGKILL`, `SIGTERM`, ...) stops the program: codebox
//!   stops a run one way whatever the name (its stop: SIGTERM to `codebox-init`, which ends
//!   the program, then a kill), and reports it as Piston reports a killed program (SIGKILL);
//! - an error is `error {message}`, then close 4002 "Notified Error"; Piston's other close
//!   codes as Piston uses them (4000 already initialized, 4001 no init in time, 4003 not yet
//!   initialized, 4004 only stdin is writable, 4005 invalid signal).
//!
//! The client going away stops the run: nobody is left to answer it. The program's stdin is
//! `codebox-init`'s own stdin, passed to the program, so it needs nothing of the images.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc::{self, error::TrySendError};

use super::ExecuteRequest;
use super::{parse_json, piston_field, response, to_run, version_matches, version_of};
use crate::api::Api;
use crate::live::Event;
use crate::report::Stage;
use crate::runs::SubmitError;

/// How long the client has for its `init` (Piston's second).
const INIT_TIMEOUT: Duration = Duration::from_secs(1);
/// Stdin messages queued for the program.
const STDIN_QUEUE: usize = 64;
/// Stdin bytes held here once that queue is full, while the client's other messages (a
/// signal, its leaving) are still read; beyond them the client is made to wait.
const STDIN_HELD_BYTES: usize = 1 << 20;

/// The signal names Piston accepts.
const SIGNALS: &[&str] = &[
    "SIGABRT",
    "SIGALRM",
    "SIGBUS",
    "SIGCHLD",
    "SIGCLD",
    "SIGCONT",
    "SIGEMT",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINFO",
    "SIGINT",
    "SIGIO",
    "SIGIOT",
    "SIGKILL",
    "SIGLOST",
    "SIGPIPE",
    "SIGPOLL",
    "SIGPROF",
    "SIGPWR",
    "SIGQUIT",
    "SIGSEGV",
    "SIGSTKFLT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGSYS",
    "SIGTERM",
    "SIGTRAP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGUNUSED",
    "SIGURG",
    "SIGUSR1",
    "SIGUSR2",
    "SIGVTALRM",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGWINCH",
];

/// The route, at `/api/v2/connect`.
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/api/v2/connect", get(connect))
        .with_state(api)
}

async fn connect(State(api): State<Api>, ws: WebSocketUpgrade) -> Response {
    ws.on_upgrade(move |socket| async move {
        let _reader = api.manager().live_reader();
        Connection { api, socket }.serve().await
    })
}

struct Connection {
    api: Api,
    socket: WebSocket,
}

impl Connection {
    async fn send(&mut self, value: Value) -> bool {
        self.socket
            .send(Message::Text(value.to_string().into()))
            .await
            .is_ok()
    }

    async fn close(mut self, code: u16, reason: &'static str) {
        let _ = self
            .socket
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await;
    }

    async fn error(mut self, message: String) {
        self.send(json!({"type": "error", "message": message}))
            .await;
        self.close(4002, "Notified Error").await;
    }

    /// The next text message as JSON; `None` when the client went away.
    async fn next(&mut self) -> Option<Result<Value, String>> {
        loop {
            match self.socket.recv().await? {
                Ok(Message::Text(t)) => {
                    return Some(serde_json::from_str(&t).map_err(|e| e.to_string()))
                }
                Ok(Message::Binary(b)) => {
                    return Some(serde_json::from_slice(&b).map_err(|e| e.to_string()))
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => continue,
            }
        }
    }

    async fn serve(mut self) {
        let first = match tokio::time::timeout(INIT_TIMEOUT, self.next()).await {
            Err(_) => return self.close(4001, "Initialization Timeout").await,
            Ok(None) => return,
            Ok(Some(Err(e))) => return self.error(e).await,
            Ok(Some(Ok(m))) => m,
        };
        match first["type"].as_str() {
            Some("init") => {}
            Some("data") | Some("signal") => return self.close(4003, "Not yet initialized").await,
            _ => return self.error("the first message must be `init`".into()).await,
        }
        let req: ExecuteRequest = match parse_json(first.to_string().as_bytes()) {
            Ok(r) => r,
            Err(e) => return self.error(e.message()).await,
        };
        let versions = self.api.versions().await;
        let registry = self.api.manager().registry().clone();
        let wanted = req.version.clone();
        let Some(lang) = registry
            .resolve_piston(&req.language)
            .filter(|l| version_matches(wanted.as_deref(), version_of(&versions, l)))
        else {
            let message = format!(
                "{}-{} runtime is unknown",
                req.language,
                wanted.as_deref().unwrap_or("*")
            );
            return self.error(message).await;
        };
        let run = match to_run(&self.api, req, lang) {
            Ok(r) => r,
            Err(message) => return self.error(message).await,
        };
        let (stdin, program_stdin) = mpsc::channel::<Bytes>(STDIN_QUEUE);
        let m = self.api.manager().clone();
        let (accepted, feed) = match m.submit_interactive(run, program_stdin) {
            Ok(a) => a,
            Err(SubmitError::Invalid(e)) => {
                return self
                    .error(format!("{}: {}", piston_field(&e.field), e.message))
                    .await
            }
            Err(e) => return self.error(e.to_string()).await,
        };
        let run_id = accepted.run_id;
        let version = version_of(&versions, lang).to_string();
        let runtime =
            json!({"type": "runtime", "language": lang.piston.language, "version": version});
        if !self.send(runtime).await {
            let _ = m.stop(&run_id).await;
            return;
        }
        let mut changes = feed.subscribe();
        let mut seen = 0;
        let mut compiled = false;
        let mut stdin = Some(stdin);
        let mut held = Held::default();
        loop {
            let (mut events, ended) = feed.after(seen);
            if ended && !matches!(events.last(), Some((_, Event::Report(_)))) {
                // Given back to the shared queue without a report: another server's report
                // (or this one's, after a new claim) ends it.
                let Ok(report) = m.wait_end(&run_id).await else {
                    return self.close(4999, "Job Completed").await;
                };
                let last = events.last().map(|(i, _)| *i).unwrap_or(seen);
                events.push((last + 1, Event::Report(Arc::new(report))));
            }
            for (id, event) in events {
                seen = id;
                let message = match event {
                    Event::Started { stage } => {
                        let mut out = Vec::new();
                        if stage == Stage::Compile {
                            compiled = true;
                        } else if compiled {
                            // The compile stage ended well, or no run stage would start.
                            out.push(json!({"type": "exit", "stage": "compile", "code": 0, "signal": null}));
                        }
                        out.push(json!({"type": "stage", "stage": stage.as_str()}));
                        out
                    }
                    Event::Output { stream, data, .. } => {
                        vec![json!({"type": "data", "stream": stream.as_str(), "data": data})]
                    }
                    Event::Report(report) => {
                        let answer = response(lang, &version, &report);
                        let (stage, result) = match (answer.run, answer.compile) {
                            (Some(run), _) => ("run", run),
                            (None, Some(compile)) => ("compile", compile),
                            (None, None) => return self.close(4999, "Job Completed").await,
                        };
                        let mut exit = json!({"type": "exit", "stage": stage, "code": result.code, "signal": result.signal});
                        if let Some(message) = result.message.filter(|_| result.status.is_some()) {
                            exit["error"] = Value::String(message);
                        }
                        self.send(exit).await;
                        return self.close(4999, "Job Completed").await;
                    }
                    Event::Queued | Event::Truncated { .. } | Event::File { .. } => Vec::new(),
                };
                for msg in message {
                    if !self.send(msg).await {
                        let _ = m.stop(&run_id).await;
                        return;
                    }
                }
            }
            tokio::select! {
                changed = changes.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                // Held stdin goes on as the program reads: awaited here, never in an arm.
                permit = reserve(&stdin), if !held.is_empty() => match permit {
                    Some(permit) => {
                        permit.send(held.pop());
                    }
                    None => {
                        stdin = None; // the program's stdin is closed
                        held = Held::default();
                    }
                },
                incoming = self.next(), if held.bytes < STDIN_HELD_BYTES => {
                    let Some(incoming) = incoming else {
                        // The client went away: nobody can answer the program any more.
                        let _ = m.stop(&run_id).await;
                        return;
                    };
                    let msg = match incoming {
                        Ok(msg) => msg,
                        Err(e) => {
                            let _ = m.stop(&run_id).await;
                            return self.error(e).await;
                        }
                    };
                    match msg["type"].as_str() {
                        Some("init") => {
                            let _ = m.stop(&run_id).await;
                            return self.close(4000, "Already Initialized").await;
                        }
                        Some("data") if msg["stream"] == "stdin" => {
                            let data = msg["data"].as_str().unwrap_or_default().to_string();
                            let data = Bytes::from(data);
                            match &stdin {
                                Some(_) if !held.is_empty() => held.push(data),
                                Some(tx) => match tx.try_send(data) {
                                    Ok(()) => {}
                                    Err(TrySendError::Full(data)) => held.push(data),
                                    Err(TrySendError::Closed(_)) => stdin = None,
                                },
                                None => {}
                            }
                        }
                        Some("data") => {
                            let _ = m.stop(&run_id).await;
                            return self.close(4004, "Can only write to stdin").await;
                        }
                        Some("signal") => {
                            let valid = msg["signal"].as_str().is_some_and(|s| SIGNALS.contains(&s));
                            if !valid {
                                let _ = m.stop(&run_id).await;
                                return self.close(4005, "Invalid signal").await;
                            }
                            // Stopped in the background: its report comes through the feed.
                            let m = m.clone();
                            let id = run_id.clone();
                            tokio::spawn(async move { m.stop(&id).await });
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}

/// Stdin the program's queue had no room for yet, in order.
#[derive(Default)]
struct Held {
    chunks: VecDeque<Bytes>,
    bytes: usize,
}

impl Held {
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    fn push(&mut self, data: Bytes) {
        self.bytes += data.len();
        self.chunks.push_back(data);
    }

    fn pop(&mut self) -> Bytes {
        let data = self.chunks.pop_front().unwrap_or_default();
        self.bytes -= data.len();
        data
    }
}

/// Room in the program's stdin queue; `None` once it is closed. (Owned: the select's
/// handlers may then close `stdin`.)
async fn reserve(stdin: &Option<mpsc::Sender<Bytes>>) -> Option<mpsc::OwnedPermit<Bytes>> {
    stdin.clone()?.reserve_owned().await.ok()
}
