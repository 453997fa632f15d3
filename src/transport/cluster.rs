//! The HTTP side of several servers as one (SPEC section 15, [`crate::cluster`]):
//! - `/v1` calls about a run or session another server holds (`GET`/`DELETE
//!   /v1/runs/{id}`, `GET /v1/runs/{id}/events`, `POST /v1/runs` with a `session_id`, `DELETE /v1/sessions/{id}`,
//!   `GET /v1/sessions/{id}/files...`) are forwarded to it as they are, and its answer is
//!   passed back as it comes;
//! - `POST /cluster/tools/{tool}` takes the MCP tool calls another server forwards
//!   ([`crate::mcp::answer_forwarded`]); only with the cluster secret. A `run_code` asked with
//!   `Accept: application/x-ndjson` answers a stream: its progress notifications, one JSON
//!   line each, as they come, then its result ([`crate::mcp::StreamLine`]).
//!
//! A request that carries the cluster secret is never forwarded again.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio_util::sync::CancellationToken;

use crate::api::v1::V1Error;
use crate::api::{read_body, Client};
use crate::cluster::{Cluster, Held, Peer, WAIT_SLACK};
use crate::contract::ids;
use crate::contract::params::MAX_WAIT_SECONDS;
use crate::mcp::{answer_forwarded, CodeboxServer};

/// What the forwarding middleware needs.
#[derive(Clone)]
pub(super) struct Forwarding {
    pub server: CodeboxServer,
    pub cluster: Arc<Cluster>,
    pub max_body: usize,
}

/// What a `/v1` request is about, when it names a run or a session.
#[derive(Debug, PartialEq)]
enum Subject {
    Run(String),
    Session(String),
}

impl Subject {
    fn held(&self) -> Held<'_> {
        match self {
            Subject::Run(id) => Held::Run(id),
            Subject::Session(id) => Held::Session(id),
        }
    }
}

impl From<Held<'_>> for Subject {
    fn from(held: Held<'_>) -> Subject {
        match held {
            Held::Run(id) => Subject::Run(id.to_string()),
            Held::Session(id) => Subject::Session(id.to_string()),
        }
    }
}

/// The run or session a `/v1` path names (`POST /v1/runs` is read from its body).
fn subject(method: &Method, path: &str) -> Option<Subject> {
    let rest = path.strip_prefix("/v1/")?;
    let mut parts = rest.splitn(3, '/');
    let (kind, id, tail) = (parts.next()?, parts.next()?, parts.next());
    if id.is_empty() {
        return None;
    }
    let id = percent_decode(id)?;
    match (kind, method, tail) {
        ("runs", &Method::GET | &Method::DELETE, None) => Some(Subject::Run(ids::run_id(&id))),
        // Live output (SPEC section 14): the owner's stream, passed on as it comes.
        ("runs", &Method::GET, Some("events")) => Some(Subject::Run(ids::run_id(&id))),
        ("sessions", &Method::DELETE, None) => Some(Subject::Session(id)),
        ("sessions", &Method::GET, Some(t)) if t == "files" || t.starts_with("files/") => {
            Some(Subject::Session(id))
        }
        _ => None,
    }
}

/// `%XX` escapes of a path segment decoded (`None` if not UTF-8 once decoded).
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).ok()
}

/// The `wait_seconds` of a query, if it holds a valid one.
fn wait_of(query: Option<&str>) -> Duration {
    let wait = crate::api::query_pairs(query)
        .into_iter()
        .find(|(k, _)| k == "wait_seconds")
        .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        .filter(|w| w.is_finite())
        .unwrap_or(0.0)
        .clamp(0.0, MAX_WAIT_SECONDS);
    Duration::from_secs_f64(wait)
}

/// Forward a `/v1` call about another server's run or session to it; anything else (and
/// anything another server forwarded) is served here.
pub(super) async fn forward_v1(
    State(f): State<Forwarding>,
    request: Request,
    next: Next,
) -> Response {
    if f.cluster.accepts(request.headers()) {
        return next.run(request).await;
    }
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    // An execution in a session: the session is named in the body.
    if method == Method::POST && path == "/v1/runs" {
        let (parts, body) = request.into_parts();
        let bytes = match read_body(body, f.max_body).await {
            Ok(b) => b,
            Err(e) => return V1Error::from(e).into_response(),
        };
        let session = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("session_id")?.as_str().map(str::to_string));
        if let Some(session) = session {
            if let Some(peer) = f.cluster.session_owner(f.server.sessions(), &session).await {
                let client = Client::of(&parts);
                let held = Held::Session(&session);
                let sent = send(&f, &peer, held, &parts, bytes.clone(), None, client).await;
                if let Some(response) = sent {
                    return response;
                }
            }
        }
        return next
            .run(Request::from_parts(parts, Body::from(bytes)))
            .await;
    }
    let Some(subject) = subject(&method, &path) else {
        return next.run(request).await;
    };
    let m = f.server.manager();
    let (peer, timeout) = match &subject {
        Subject::Run(id) => (
            f.cluster.run_owner(m, id).await,
            (method == Method::GET).then(|| wait_of(request.uri().query()) + WAIT_SLACK),
        ),
        Subject::Session(id) => (f.cluster.session_owner(f.server.sessions(), id).await, None),
    };
    let Some(peer) = peer else {
        return next.run(request).await;
    };
    let (parts, body) = request.into_parts();
    let bytes = match read_body(body, f.max_body).await {
        Ok(b) => b,
        Err(e) => return V1Error::from(e).into_response(),
    };
    let client = Client::of(&parts);
    let held = subject.held();
    match send(&f, &peer, held, &parts, bytes.clone(), timeout, client).await {
        Some(response) => response,
        None => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
    }
}

/// Send the request, about `held`, to `peer` and pass its answer back; the client leaving
/// drops the call (so the owner sees its caller leave too, and stops a run it was waiting on
/// for it). `None` when `peer` can no longer answer for it ([`Cluster::released`]) before it
/// answers: this server answers then. An answer under way (an event stream) ends then.
async fn send(
    f: &Forwarding,
    peer: &Peer,
    held: Held<'_>,
    parts: &axum::http::request::Parts,
    bytes: bytes::Bytes,
    timeout: Option<Duration>,
    client: Client,
) -> Option<Response> {
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| parts.uri.path().to_string());
    tracing::debug!(
        owner = peer.instance,
        path = path_and_query,
        "forwarding a call to the server that holds its run or session"
    );
    let sent = f.cluster.send(
        peer,
        parts.method.clone(),
        &path_and_query,
        &parts.headers,
        bytes,
        timeout,
    );
    let answer = tokio::select! {
        answer = sent => answer,
        _ = client.gone() => return Some(StatusCode::NO_CONTENT.into_response()),
        _ = f.cluster.released(f.server.manager(), peer, held) => return None,
    };
    Some(match answer {
        Ok(response) => until_released(f, peer, held, response),
        Err(e) => V1Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
            e.to_string(),
        )
        .into_response(),
    })
}

/// The owner's answer, ended once `peer` can no longer answer for `held`: a stream from an
/// owner that was paused would otherwise wait for ever. The client asks again (with
/// `Last-Event-ID`) and this server answers from the history.
fn until_released(f: &Forwarding, peer: &Peer, held: Held<'_>, response: Response) -> Response {
    use futures_util::StreamExt;
    let (cluster, manager) = (f.cluster.clone(), f.server.manager().clone());
    let (peer, subject) = (peer.clone(), Subject::from(held));
    let released = async move { cluster.released(&manager, &peer, subject.held()).await };
    let (parts, body) = response.into_parts();
    let body = body.into_data_stream().take_until(released);
    Response::from_parts(parts, Body::from_stream(body))
}

/// `POST /cluster/tools/{tool}`: a tool call another server forwarded, carried out here.
pub(super) async fn tool_call(
    State(f): State<Forwarding>,
    Path(tool): Path<String>,
    client: Client,
    request: Request,
) -> Response {
    if !f.cluster.accepts(request.headers()) {
        return (
            StatusCode::UNAUTHORIZED,
            "this route is for the other codebox servers of the cluster: missing or wrong cluster secret\n",
        )
            .into_response();
    }
    let wants_stream = request
        .headers()
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains(crate::mcp::PROGRESS_STREAM));
    let bytes = match read_body(request.into_body(), f.max_body).await {
        Ok(b) => b,
        Err(e) => return (StatusCode::BAD_REQUEST, e.message()).into_response(),
    };
    let args: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}\n"),
            )
                .into_response()
        }
    };
    if tool == "run_code" && wants_stream {
        return streamed_run_code(f.server.clone(), args);
    }
    let ct = CancellationToken::new();
    let call = answer_forwarded(&f.server, &tool, args, ct.clone(), None);
    tokio::pin!(call);
    let result = tokio::select! {
        r = &mut call => r,
        _ = client.gone() => {
            // The forwarding server left (its client cancelled): stop as a cancellation does.
            ct.cancel();
            call.await
        }
    };
    axum::Json(result).into_response()
}

/// A forwarded `run_code` whose caller asked for progress: its notifications as JSON lines
/// while it runs, then its result. The forwarding server going away (its caller cancelled)
/// closes the stream, and the run stops as on a cancellation.
fn streamed_run_code(server: CodeboxServer, args: serde_json::Value) -> Response {
    use crate::mcp::StreamLine;
    let (progress, mut notes) = tokio::sync::mpsc::channel(16);
    let (lines, body) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    let line = |l: &StreamLine| {
        let mut v = serde_json::to_vec(l).unwrap_or_default();
        v.push(b'\n');
        bytes::Bytes::from(v)
    };
    tokio::spawn(async move {
        let ct = CancellationToken::new();
        let call = answer_forwarded(&server, "run_code", args, ct.clone(), Some(progress));
        tokio::pin!(call);
        let result = loop {
            tokio::select! {
                r = &mut call => break r,
                Some(p) = notes.recv() => {
                    if lines.send(line(&StreamLine::Progress(p))).await.is_err() {
                        ct.cancel();
                    }
                }
                () = lines.closed(), if !ct.is_cancelled() => ct.cancel(),
            }
        };
        while let Ok(p) = notes.try_recv() {
            let _ = lines.send(line(&StreamLine::Progress(p))).await;
        }
        let _ = lines.send(line(&StreamLine::Result(result))).await;
    });
    let stream = futures_util::stream::unfold(body, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(
            axum::http::header::CONTENT_TYPE,
            crate::mcp::PROGRESS_STREAM,
        )
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_of_a_v1_path() {
        let run = |id: &str| Some(Subject::Run(id.to_string()));
        let session = |id: &str| Some(Subject::Session(id.to_string()));
        assert_eq!(subject(&Method::GET, "/v1/runs/r1"), run("r1"));
        assert_eq!(subject(&Method::DELETE, "/v1/runs/r1"), run("r1"));
        assert_eq!(subject(&Method::POST, "/v1/runs/r1"), None);
        assert_eq!(subject(&Method::GET, "/v1/runs/r1/events"), run("r1"));
        assert_eq!(subject(&Method::GET, "/v1/runs/r1/other"), None);
        assert_eq!(subject(&Method::GET, "/v1/runs"), None);
        assert_eq!(subject(&Method::DELETE, "/v1/sessions/s1"), session("s1"));
        assert_eq!(subject(&Method::GET, "/v1/sessions/s1"), None);
        assert_eq!(
            subject(&Method::GET, "/v1/sessions/s1/files"),
            session("s1")
        );
        assert_eq!(
            subject(&Method::GET, "/v1/sessions/s1/files/a%20b.txt"),
            session("s1")
        );
        assert_eq!(
            subject(&Method::GET, "/v1/sessions/s%31/files/"),
            session("s1")
        );
        assert_eq!(subject(&Method::GET, "/v1/history"), None);
        assert_eq!(subject(&Method::GET, "/v1/languages"), None);
    }

    #[test]
    fn the_wait_of_a_query() {
        assert_eq!(wait_of(None), Duration::ZERO);
        assert_eq!(
            wait_of(Some("wait_seconds=2.5")),
            Duration::from_millis(2500)
        );
        assert_eq!(
            wait_of(Some("wait_seconds=9999")),
            Duration::from_secs_f64(MAX_WAIT_SECONDS)
        );
        assert_eq!(wait_of(Some("wait_seconds=x")), Duration::ZERO);
    }
}
