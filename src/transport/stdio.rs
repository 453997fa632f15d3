//! MCP over stdin/stdout. stdout belongs to the protocol: nothing else may print there
//! (logs go to stderr, see `main.rs`).

use std::future::Future;

use rmcp::ServiceExt;

use super::ServeError;
use crate::mcp::CodeboxServer;

/// Serve one MCP session on stdio until the client closes stdin or `shutdown` resolves.
pub async fn serve(
    server: CodeboxServer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeError::Session(e.to_string()))?;
    let ct = running.cancellation_token();
    tokio::select! {
        quit = running.waiting() => {
            tracing::info!(reason = ?quit.ok(), "the MCP client closed the session");
        }
        _ = shutdown => {
            tracing::info!("shutting down on signal");
            ct.cancel();
        }
    }
    Ok(())
}
