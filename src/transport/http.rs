//! Streamable HTTP: `/mcp` (rmcp's service behind a bearer-token check), `GET /healthz`
//! (no token), `GET /metrics` (Prometheus text, token required like `/mcp`), and the APIs
//! for programs of [`crate::api`] (`/v1`, Piston's `/api/v2`, Judge0's routes) behind the
//! same token, body cap and Host check.
//!
//! # Security
//! The token is compared in constant time (both sides are hashed first, so the comparison
//! does not even leak the length). rmcp's Host check stays on (`http.allowed_hosts`): it is
//! what stops a web page from reaching a loopback server through DNS rebinding. Request
//! bodies above `http.max_body_bytes` are refused with 413 before they are parsed.
//! Without a token the server only starts on a loopback address and only with `--no-auth`.
//! The APIs for programs get the same Host check, and refuse any request with an `Origin`
//! header: browsers send one with every cross-site POST, even a "simple" `text/plain` one
//! that needs no preflight, and Piston's clients post JSON as `text/plain`; without this a
//! web page could run code through a `--no-auth` server on loopback. The one exception is
//! the console's own page ([`super::console`], unless `http.console = false`): an `Origin`
//! that is exactly this server's (the Host it asked for, itself checked) is allowed.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt as _;
use rmcp::model::{ErrorData, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

use super::cluster::{self, Forwarding};
use super::jsonrpc::{self, Incoming};
use super::ServeError;
use crate::api::{self, Api};
use crate::cluster::Cluster;
use crate::config::HttpSettings;
use crate::mcp::ClusterServer;
use crate::runs::RunManager;
use crate::sessions::Sessions;

pub use super::auth::{resolve_auth, Token};

#[derive(Clone)]
struct AppState {
    manager: RunManager,
    sessions: Arc<Sessions>,
    token: Option<Token>,
    cluster: Option<Arc<Cluster>>,
}

/// Whether a request comes from another server of the cluster (carries the secret).
fn from_cluster(cluster: &Option<Arc<Cluster>>, request: &Request) -> bool {
    cluster
        .as_ref()
        .is_some_and(|c| c.accepts(request.headers()))
}

async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
    if from_cluster(&state.cluster, &request) {
        return next.run(request).await;
    }
    if let Some(token) = &state.token {
        if !token.accepts(request.headers().get(header::AUTHORIZATION)) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer realm=\"codebox\"")],
                "missing or wrong bearer token\n",
            )
                .into_response();
        }
    }
    next.run(request).await
}

/// What this server can take (SPEC section 15): its slots, memory budget and sessions, and
/// how much of each is in use, for a balancer or an operator.
fn capacity(m: &RunManager, s: &crate::runs::Stats) -> serde_json::Value {
    let c = m.config();
    serde_json::json!({
        "slots": c.runs.max_concurrent_runs,
        "slots_free": c.runs.max_concurrent_runs.saturating_sub(s.active),
        "memory_budget_mb": c.runs.memory_budget_mb,
        "memory_free_mb": c.runs.memory_budget_mb.saturating_sub(s.active_memory_mb + s.sessions.memory_mb),
        "queued": s.queued,
        "max_queued": c.runs.max_queued_runs,
        "sessions": s.sessions.open,
        "max_sessions": c.sessions.max_sessions,
    })
}

async fn healthz(State(state): State<AppState>) -> Response {
    let m = &state.manager;
    let s = state.sessions.stats();
    // A draining server answers 503, so that a balancer's health check sends no new work.
    let (code, status) = if m.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, "draining")
    } else {
        (StatusCode::OK, "ok")
    };
    let body = axum::Json(serde_json::json!({
        "status": status,
        "version": env!("CARGO_PKG_VERSION"),
        "instance": m.executor().instance(),
        "queued": s.queued,
        "active": s.active,
        "capacity": capacity(m, &s),
    }));
    (code, body).into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.manager;
    let stats = state.sessions.stats();
    let mut body = m.metrics().render(&stats, m.executor().timings());
    let c = m.config();
    for (name, help, value) in [
        (
            "codebox_capacity_slots",
            "Runs this server runs at once (runs.max_concurrent_runs).",
            c.runs.max_concurrent_runs as u64,
        ),
        (
            "codebox_capacity_memory_mb",
            "Memory budget of this server's runs and sessions, in MB (runs.memory_budget_mb).",
            c.runs.memory_budget_mb,
        ),
        (
            "codebox_capacity_queued_runs",
            "Runs this server queues at most (runs.max_queued_runs).",
            c.runs.max_queued_runs as u64,
        ),
        (
            "codebox_capacity_sessions",
            "Sessions this server holds open at most (sessions.max_sessions).",
            c.sessions.max_sessions as u64,
        ),
    ] {
        body.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"
        ));
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// Which API for programs a path belongs to: each refuses in its own clients' shape.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Family {
    V1,
    Piston,
    Judge0,
}

impl Family {
    fn of(path: &str) -> Family {
        if path == "/v1" || path.starts_with("/v1/") {
            Family::V1
        } else if path == "/api/v2" || path.starts_with("/api/v2/") {
            Family::Piston
        } else {
            Family::Judge0
        }
    }

    fn refuse(self, status: StatusCode, message: &str) -> Response {
        match self {
            Family::V1 => {
                let code = match status {
                    StatusCode::UNAUTHORIZED => {
                        return api::v1::V1Error::unauthorized().into_response()
                    }
                    _ => "forbidden",
                };
                api::v1::V1Error::new(status, code, message).into_response()
            }
            Family::Piston => api::piston::refusal(status, message),
            Family::Judge0 => api::judge0::refusal(status, message),
        }
    }
}

#[derive(Clone)]
struct ProgramPolicy {
    token: Option<Token>,
    allowed_hosts: Arc<Vec<String>>,
    /// The console is served: a request whose `Origin` is this server's own (the Host it
    /// asked for, which passed the Host check) is the console's, and allowed.
    console: bool,
    cluster: Option<Arc<Cluster>>,
}

/// Whether the request's `Origin` is the origin of the server it reached (`http://` or
/// `https://` and exactly the Host header): the console's own page.
fn same_origin(request: &Request) -> bool {
    let headers = request.headers();
    let (Some(origin), Some(host)) = (
        headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()),
        headers.get(header::HOST).and_then(|v| v.to_str().ok()),
    ) else {
        return false;
    };
    let origin = origin.trim();
    let host = host.trim();
    !host.is_empty()
        && (origin.strip_prefix("http://") == Some(host)
            || origin.strip_prefix("https://") == Some(host))
}

/// Host header names and ports, lowercased and without IPv6 brackets.
fn authority(value: &str) -> Option<(String, Option<u16>)> {
    let a = axum::http::uri::Authority::try_from(value.trim()).ok()?;
    let host = a.host().trim_start_matches('[').trim_end_matches(']');
    Some((host.to_ascii_lowercase(), a.port_u16()))
}

/// rmcp's rule: `name` allows any port, `name:port` that port only.
fn host_allowed(request: &Request, allowed: &[String]) -> bool {
    let Some((host, port)) = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(authority)
    else {
        return false;
    };
    allowed
        .iter()
        .filter_map(|a| authority(a))
        .any(|(name, p)| name == host && p.is_none_or(|p| Some(p) == port))
}

/// The Host, Origin and token checks in front of the APIs for programs.
async fn guard_programs(
    State(policy): State<ProgramPolicy>,
    request: Request,
    next: Next,
) -> Response {
    let family = Family::of(request.uri().path());
    // Another server of the cluster, forwarding a call: its secret stands for the token, and
    // it names this server by its advertise_url, which the Host check need not list.
    if from_cluster(&policy.cluster, &request) {
        return next.run(request).await;
    }
    if !host_allowed(&request, &policy.allowed_hosts) {
        return family.refuse(
            StatusCode::FORBIDDEN,
            "the Host header is not one of the server's http.allowed_hosts",
        );
    }
    if request.headers().contains_key(header::ORIGIN) && !(policy.console && same_origin(&request))
    {
        return family.refuse(
            StatusCode::FORBIDDEN,
            "requests from web pages of other origins (an Origin header that is not this server's) are refused: these routes are for programs and for this server's own console; call them from a server-side program",
        );
    }
    if let Some(token) = &policy.token {
        let headers = request.headers();
        let ok = token.accepts(headers.get(header::AUTHORIZATION))
            || (family == Family::Judge0 && token.accepts_raw(headers.get("x-auth-token")));
        if !ok {
            return family.refuse(
                StatusCode::UNAUTHORIZED,
                if family == Family::Judge0 {
                    "missing or wrong token: send `X-Auth-Token: <token>` or `Authorization: Bearer <token>`"
                } else {
                    "missing or wrong bearer token: send `Authorization: Bearer <token>`"
                },
            );
        }
    }
    next.run(request).await
}

/// Whether a request says its body is JSON (`application/json`, parameters allowed).
fn says_json(request: &Request) -> bool {
    request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"))
}

/// Requests of each session whose answer is still being sent: (session id, request id).
#[derive(Clone, Default)]
struct InFlight(Arc<Mutex<HashSet<(String, String)>>>);

/// One entry of [`InFlight`], removed when dropped (with the answer's body).
struct InFlightEntry {
    set: InFlight,
    key: (String, String),
}

impl Drop for InFlightEntry {
    fn drop(&mut self) {
        let mut set = self.set.0.lock().unwrap_or_else(|p| p.into_inner());
        set.remove(&self.key);
    }
}

/// The id of a request (an object with a `method`), read without the rest of the message.
fn request_id(body: &[u8]) -> Option<rmcp::model::RequestId> {
    #[derive(serde::Deserialize)]
    struct Probe {
        method: Option<serde::de::IgnoredAny>,
        id: Option<rmcp::model::RequestId>,
    }
    let probe: Probe = serde_json::from_slice(body).ok()?;
    probe.method.and(probe.id)
}

#[derive(Clone)]
struct BodyPolicy {
    max_body: usize,
    in_flight: InFlight,
}

/// Read a POST body (within `http.max_body_bytes`) and hand it to rmcp whole, with two
/// answers of codebox's own, both as JSON-RPC errors (400) carrying the request's id:
/// - a request whose id is in use by another request of the same session that is still
///   being answered (rmcp would drop one of the two answers and leave its stream open);
/// - a body rmcp refuses as unreadable (its 415 for a JSON content type; see the module
///   doc).
///
/// rmcp's own checks (Host, Accept, session) keep their order and answers.
async fn check_messages(
    State(policy): State<BodyPolicy>,
    request: Request,
    next: Next,
) -> Response {
    if request.method() == Method::DELETE {
        // rmcp ends the session with 202; the MCP Python SDK takes only 200 or 204 as a
        // success and logs "Session termination failed: 202" on every close otherwise.
        let mut response = next.run(request).await;
        if response.status() == StatusCode::ACCEPTED {
            response = StatusCode::NO_CONTENT.into_response();
        }
        return response;
    }
    if request.method() != Method::POST {
        return next.run(request).await;
    }
    let json = says_json(&request);
    let max_body = policy.max_body;
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, max_body).await {
        Ok(b) => b,
        Err(e) => {
            let too_large = e
                .into_inner()
                .downcast_ref::<http_body_util::LengthLimitError>()
                .is_some();
            // The rest of the body is not read: the connection cannot serve another request.
            return if too_large {
                (
                    StatusCode::PAYLOAD_TOO_LARGE,
                    [(header::CONNECTION, "close")],
                    format!("Payload Too Large: request body exceeds {max_body} bytes\n"),
                )
                    .into_response()
            } else {
                (
                    StatusCode::BAD_REQUEST,
                    [(header::CONNECTION, "close")],
                    "cannot read the request body\n",
                )
                    .into_response()
            };
        }
    };
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let entry = match (session, request_id(&bytes)) {
        (Some(session), Some(id)) => {
            let key = (session, id.to_string());
            let mut set = policy.in_flight.0.lock().unwrap_or_else(|p| p.into_inner());
            if !set.insert(key.clone()) {
                let text = format!(
                    "invalid request: the id {id} is already used by a request of this session that has not been answered; ids must be unique within a session"
                );
                return rpc_error(serde_json::to_value(jsonrpc::invalid(text, Some(id))));
            }
            Some(InFlightEntry {
                set: policy.in_flight.clone(),
                key,
            })
        }
        _ => None,
    };
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if response.status() == StatusCode::UNSUPPORTED_MEDIA_TYPE && json {
        let answer = match jsonrpc::parse(&bytes) {
            Incoming::Message(_) => return response,
            Incoming::Invalid { answers, batch } => {
                if batch {
                    serde_json::to_value(&answers)
                } else {
                    serde_json::to_value(&answers[0])
                }
            }
            Incoming::NotJson(error) => serde_json::to_value(ServerJsonRpcMessage::error(
                ErrorData::parse_error(format!("the body is not JSON: {error}"), None),
                None,
            )),
        };
        return rpc_error(answer);
    }
    // The id stays in use until the answer's body has been sent (or dropped).
    match entry {
        None => response,
        Some(entry) => response.map(|body| {
            Body::from_stream(body.into_data_stream().map(move |chunk| {
                let _in_flight = &entry;
                chunk
            }))
        }),
    }
}

fn rpc_error(answer: Result<serde_json::Value, serde_json::Error>) -> Response {
    match answer {
        Ok(answer) => (StatusCode::BAD_REQUEST, axum::Json(answer)).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
    }
}

/// The whole HTTP application. `ct` ends open MCP streams at shutdown.
pub fn router(
    server: ClusterServer,
    token: Option<Token>,
    policy: &HttpSettings,
    ct: CancellationToken,
) -> Router {
    let manager = server.server().manager().clone();
    let sessions = server.server().sessions().clone();
    let cluster = server.cluster().cloned();
    let forwarding = cluster.clone().map(|cluster| Forwarding {
        server: server.server().clone(),
        cluster,
        max_body: policy.max_body_bytes,
    });
    let mcp_config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(policy.allowed_hosts.clone())
        .with_max_request_body_bytes(policy.max_body_bytes)
        .with_cancellation_token(ct);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    let programs_api = Api::new(sessions.clone(), policy.max_body_bytes);
    let mut programs = Router::new()
        .nest("/v1", api::v1::router(programs_api.clone()))
        .merge(api::piston::router(programs_api.clone()))
        .merge(api::piston::connect::router(programs_api.clone()))
        .merge(api::judge0::router(programs_api));
    if let Some(f) = &forwarding {
        programs = programs
            .layer(middleware::from_fn_with_state(
                f.clone(),
                cluster::forward_v1,
            ))
            .route(
                &format!("{}/{{tool}}", crate::mcp::TOOLS_PATH),
                axum::routing::post(cluster::tool_call).with_state(f.clone()),
            );
    }
    let programs = programs.layer(middleware::from_fn_with_state(
        ProgramPolicy {
            token: token.clone(),
            allowed_hosts: Arc::new(policy.allowed_hosts.clone()),
            console: policy.console,
            cluster: cluster.clone(),
        },
        guard_programs,
    ));
    let console = if policy.console {
        super::console::samples(manager.clone())
    } else {
        Router::new()
    };
    let state = AppState {
        manager,
        sessions,
        token,
        cluster,
    };
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .layer(middleware::from_fn_with_state(
            BodyPolicy {
                max_body: policy.max_body_bytes,
                in_flight: InFlight::default(),
            },
            check_messages,
        ))
        .route("/metrics", get(metrics))
        .with_state(state.clone())
        .merge(console)
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    let app = Router::new()
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(protected)
        .merge(programs);
    if policy.console {
        app.merge(super::console::pages())
    } else {
        app
    }
}

/// Bind the listen address and serve until `shutdown` resolves.
pub async fn serve(
    server: ClusterServer,
    http: &HttpSettings,
    token: Option<Token>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = http.listen.clone();
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: addr.clone(),
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: addr.clone(),
        source,
    })?;
    let ct = CancellationToken::new();
    let app = router(server, token.clone(), http, ct.child_token());
    // The one line on stderr a supervisor (or a test using port 0) reads to find the port.
    eprintln!(
        "codebox: serving MCP at http://{local}/mcp ({}){}",
        if token.is_some() {
            "bearer token required"
        } else {
            "no authentication"
        },
        if http.console {
            format!("; the console at http://{local}/")
        } else {
            String::new()
        }
    );
    let stop = ct.clone();
    serve_connections(listener, app, async move {
        shutdown.await;
        tracing::info!("shutting down: closing the connections");
        stop.cancel();
    })
    .await;
    Ok(())
}

/// How long a client may take to send a request's headers (slow clients would otherwise
/// hold connections forever).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the open connections have to finish once shutdown begins (the runs have
/// ended or been stopped by then): a client that never finishes its request, or never reads
/// its answer, must not keep the server from exiting.
const CLOSING_GRACE: Duration = Duration::from_secs(10);
/// Pause after a failed accept (e.g. out of file descriptors) before the next one.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The stream for hyper, and a [`api::Peer`] on a second descriptor of the same socket
/// (none when the descriptor cannot be duplicated, e.g. out of descriptors).
fn watched(
    stream: tokio::net::TcpStream,
) -> std::io::Result<(tokio::net::TcpStream, Option<api::Peer>)> {
    let std = stream.into_std()?;
    let peer = std
        .try_clone()
        .and_then(tokio::net::TcpStream::from_std)
        .map_err(|e| tracing::debug!(error = %e, "a connection is served without a watch"))
        .ok()
        .map(api::Peer::new);
    Ok((tokio::net::TcpStream::from_std(std)?, peer))
}

/// Serve HTTP/1.1 connections until `shutdown` resolves, then let the open ones finish.
///
/// Not `axum::serve`, for two settings it does not expose: a client that closes its sending
/// half after the request (`shutdown(SHUT_WR)`) still gets the answer (hyper's
/// `half_close`), and headers must arrive within [`HEADER_READ_TIMEOUT`].
pub async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    shutdown: impl Future<Output = ()>,
) {
    let (closing, closing_rx) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        // A second descriptor of the socket lets a waiting handler notice its client going
        // away (`api::client`); without one the request is served all the same.
        let (stream, peer) = match watched(stream) {
            Ok(pair) => pair,
            Err(e) => {
                tracing::warn!(error = %e, "cannot set up a connection");
                continue;
            }
        };
        let handle = peer.as_ref().map(api::Peer::handle);
        let service = hyper_util::service::TowerToHyperService::new(app.clone().map_request(
            move |r: hyper::Request<hyper::body::Incoming>| {
                let mut r = r.map(Body::new);
                if let Some(handle) = &handle {
                    r.extensions_mut().insert(handle.clone());
                }
                r
            },
        ));
        let mut closing = closing_rx.clone();
        connections.spawn(async move {
            // The watch lives exactly as long as the connection.
            let _peer = peer;
            let connection = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .with_upgrades();
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "a connection ended with an error");
                    }
                    return;
                }
                _ = closing.wait_for(|c| *c) => {}
            }
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        });
        // Forget the connections that ended.
        while connections.try_join_next().is_some() {}
    }
    let _ = closing.send(true);
    let finished = tokio::time::timeout(CLOSING_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "connections still open {} s after shutdown began are cut",
            CLOSING_GRACE.as_secs()
        );
        connections.abort_all();
        while connections.join_next().await.is_some() {}
    }
}
