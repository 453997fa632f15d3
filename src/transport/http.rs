//! Streamable HTTP: `/mcp` (rmcp's service behind a bearer-token check), `GET /healthz`
//! (no token) and `GET /metrics` (Prometheus text, token required like `/mcp`).
//!
//! # Security
//! The token is compared in constant time (both sides are hashed first, so the comparison
//! does not even leak the length). rmcp's Host check stays on (`http.allowed_hosts`): it is
//! what stops a web page from reaching a loopback server through DNS rebinding. Request
//! bodies above `http.max_body_bytes` are refused with 413 before they are parsed.
//! Without a token the server only starts on a loopback address and only with `--no-auth`.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio_util::sync::CancellationToken;

use super::ServeError;
use crate::config::HttpSettings;
use crate::mcp::CodeboxServer;
use crate::runs::RunManager;

/// A bearer token, kept only as its SHA-256.
#[derive(Clone)]
pub struct Token {
    digest: [u8; 32],
}

impl Token {
    pub fn new(secret: &str) -> Token {
        Token {
            digest: Sha256::digest(secret.as_bytes()).into(),
        }
    }

    /// Constant-time check of an `Authorization` header value.
    pub fn accepts(&self, authorization: Option<&HeaderValue>) -> bool {
        let Some(value) = authorization.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let Some((scheme, presented)) = value.trim().split_once(' ') else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case("bearer") {
            return false;
        }
        let presented: [u8; 32] = Sha256::digest(presented.trim().as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Decide how `/mcp` is protected. The token comes from the first of: the `--token-file`
/// flag (`flag_file`), the `CODEBOX_TOKEN` variable (`env_token`), the `http.token_file`
/// setting; or there is none, which only `--no-auth` on a loopback address allows.
pub fn resolve_auth(
    http: &HttpSettings,
    flag_file: Option<&Path>,
    env_token: Option<String>,
    no_auth: bool,
) -> Result<Option<Token>, ServeError> {
    let addr: SocketAddr = http.listen.parse().map_err(|_| {
        ServeError::Invalid(format!(
            "setting `http.listen` = {:?} is not an address",
            http.listen
        ))
    })?;
    let env_token = env_token.filter(|t| !t.trim().is_empty());
    let file = match (flag_file, &env_token) {
        (Some(f), _) => Some(f.to_path_buf()),
        (None, Some(_)) => None,
        (None, None) => http.token_file.clone(),
    };
    let secret = match (file, env_token) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(&path).map_err(|source| ServeError::TokenFile {
                path: path.clone(),
                source,
            })?;
            let t = text.trim().to_string();
            if t.is_empty() {
                return Err(ServeError::Invalid(format!(
                    "the token file {} is empty",
                    path.display()
                )));
            }
            Some(t)
        }
        (None, Some(t)) => Some(t.trim().to_string()),
        (None, None) => None,
    };
    if no_auth {
        if !addr.ip().is_loopback() {
            return Err(ServeError::NoAuthOnPublicAddress(addr.to_string()));
        }
        if secret.is_some() {
            return Err(ServeError::Invalid(
                "--no-auth was given together with a token (CODEBOX_TOKEN or a token file); choose one".into(),
            ));
        }
        tracing::warn!(%addr, "serving HTTP without authentication (--no-auth): any local process can run code");
        return Ok(None);
    }
    let Some(secret) = secret else {
        return Err(ServeError::NoToken);
    };
    if secret.len() < 16 {
        tracing::warn!("the bearer token is shorter than 16 characters; use a long random one");
    }
    Ok(Some(Token::new(&secret)))
}

#[derive(Clone)]
struct AppState {
    manager: RunManager,
    token: Option<Token>,
}

async fn require_token(State(state): State<AppState>, request: Request, next: Next) -> Response {
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

async fn healthz(State(state): State<AppState>) -> Response {
    let s = state.manager.stats();
    axum::Json(serde_json::json!({
        "status": "ok",
        "version": env!("CARGO_PKG_VERSION"),
        "queued": s.queued,
        "active": s.active,
    }))
    .into_response()
}

async fn metrics(State(state): State<AppState>) -> Response {
    let m = &state.manager;
    let body = m.metrics().render(&m.stats(), m.executor().timings());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

/// The whole HTTP application. `ct` ends open MCP streams at shutdown.
pub fn router(
    server: CodeboxServer,
    token: Option<Token>,
    policy: &HttpSettings,
    ct: CancellationToken,
) -> Router {
    let manager = server.manager().clone();
    let mcp_config = StreamableHttpServerConfig::default()
        .with_allowed_hosts(policy.allowed_hosts.clone())
        .with_max_request_body_bytes(policy.max_body_bytes)
        .with_cancellation_token(ct);
    let mcp = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    let state = AppState { manager, token };
    let protected = Router::new()
        .nest_service("/mcp", mcp)
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token))
        .with_state(state.clone());
    Router::new()
        .route("/healthz", get(healthz))
        .with_state(state)
        .merge(protected)
}

/// Bind the listen address and serve until `shutdown` resolves.
pub async fn serve(
    server: CodeboxServer,
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
        "codebox: serving MCP at http://{local}/mcp ({})",
        if token.is_some() {
            "bearer token required"
        } else {
            "no authentication"
        }
    );
    let stop = ct.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!("shutting down on signal");
            stop.cancel();
        })
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}
