//! The two MCP transports: stdio (stdout carries only the protocol, logs go to stderr) and
//! Streamable HTTP at `/mcp`, with `/healthz` and `/metrics` beside it.

pub mod http;
pub mod jsonrpc;
pub mod stdio;

use std::future::Future;
use std::path::PathBuf;

use crate::config::Config;
use crate::mcp::CodeboxServer;
use crate::runs::RunManager;

/// Which transport to serve, with what it needs.
#[derive(Debug, Clone)]
pub enum Transport {
    /// One session on stdin/stdout.
    Stdio,
    /// Streamable HTTP on `http.listen`; `None`: no authentication (loopback only, checked by
    /// [`http::resolve_auth`]).
    Http { token: Option<http::Token> },
}

/// Why the server could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("{0}")]
    Invalid(String),
    #[error("the HTTP transport needs a bearer token: set CODEBOX_TOKEN or pass --token-file FILE (on a loopback address, --no-auth serves without one)")]
    NoToken,
    #[error(
        "--no-auth is only allowed on a loopback address; {0} is not one. Set a token instead"
    )]
    NoAuthOnPublicAddress(String),
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// Serve the MCP tools of `runs` until the stdio client leaves or `shutdown` resolves. The
/// caller stops unfinished runs afterwards.
pub async fn serve(
    runs: RunManager,
    config: &Config,
    transport: Transport,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let server = CodeboxServer::new(runs);
    match transport {
        Transport::Stdio => stdio::serve(server, shutdown).await,
        Transport::Http { token } => http::serve(server, &config.http, token, shutdown).await,
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
