//! The two MCP transports: stdio (stdout carries only the protocol, logs go to stderr) and
//! Streamable HTTP at `/mcp`, with `/healthz` and `/metrics` beside it.

mod auth;
mod cluster;
pub mod console;
pub mod http;
pub mod jsonrpc;
pub mod stdio;

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

/// Time a drain gives beyond the longest a run may take (compile and run stages).
const DRAIN_SLACK: Duration = Duration::from_secs(60);

use std::sync::Arc;

use crate::cluster::{Cluster, ClusterError};
use crate::config::Config;
use crate::mcp::{ClusterServer, CodeboxServer};
use crate::sessions::Sessions;

/// Which transport to serve, with what it needs.
#[derive(Debug, Clone)]
pub enum Transport {
    /// One session on stdin/stdout.
    Stdio,
    /// Streamable HTTP on `http.listen`; `None`: no authentication (loopback only, checked by
    /// [`http::resolve_auth`]).
    Http {
        token: Option<http::Token>,
        /// This server as a member of a cluster (a shared history); see [`crate::cluster`].
        cluster: Option<Arc<Cluster>>,
    },
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
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// Serve the MCP tools of `sessions` and their runs until the stdio client leaves or
/// `shutdown` resolves. The caller ends the sessions and stops unfinished runs afterwards.
pub async fn serve(
    sessions: Arc<Sessions>,
    config: &Config,
    transport: Transport,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    match transport {
        Transport::Stdio => stdio::serve(CodeboxServer::new(sessions), shutdown).await,
        Transport::Http { token, cluster } => {
            // In a cluster, SIGTERM drains: new runs go to the other servers, the queued and
            // running ones here finish (their callers, direct or forwarded, get their reports),
            // then the server shuts down as it does alone.
            let drain = cluster.is_some().then(|| {
                Duration::from_secs_f64(config.limits.max_timeout_seconds * 2.0) + DRAIN_SLACK
            });
            let server = ClusterServer::new(CodeboxServer::new(sessions.clone()), cluster);
            // Then the sessions end and every run left is stopped while its callers are still
            // connected, so that they get its `stopped` report before the connections close.
            let shutdown = async move {
                shutdown.await;
                let runs = sessions.runs();
                if let Some(limit) = drain {
                    if !runs.drain(limit).await {
                        tracing::warn!("the drain took too long; stopping what is left");
                    }
                }
                sessions.shutdown(crate::app::SHUTDOWN_GRACE).await;
            };
            http::serve(server, &config.http, token, shutdown).await
        }
    }
}

/// Resolves on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// the future is first polled: a signal that comes in between (while the pool fills, or
/// before a stdio client has initialized its session) must not end the process at once and
/// leave its containers behind, as it did.
pub(crate) fn shutdown_signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let handlers = signal(SignalKind::terminate())
            .and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        async move {
            match handlers {
                Ok((mut term, mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot watch for SIGTERM; only Ctrl-C stops the server cleanly");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
