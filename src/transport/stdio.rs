//! MCP over stdin/stdout. stdout belongs to the protocol: nothing else may print there
//! (logs go to stderr, see `main.rs`).
//!
//! codebox reads the lines itself ([`LineTransport`]) instead of through rmcp's stdio
//! transport, which writes the answers. The protocol fuzzer (`tests/it/mcp_fuzz.rs`) found
//! two ways a client could lose its answers with rmcp's reader:
//! - a notification or a response sent before `initialize` ended rmcp's handshake, and with
//!   it the server (exit status 2). Until the session starts, such messages are now dropped.
//! - a request that is JSON but not a valid message (`params` of the wrong type, `jsonrpc`
//!   other than "2.0", a JSON-RPC batch) was answered with an error without an id, so the
//!   client could not tell which request failed and waited for its answer forever. It is
//!   now answered with its own id (each request of a batch too, as MCP has no batches).
//! - a request whose id was still in use by another unanswered request lost one of the two
//!   answers (rmcp keeps one pending entry per id), and a `run_code` could lose its report
//!   that way. MCP forbids reusing an id within a session; such a request is now answered
//!   at once with an error, and the first one keeps its answer.
//!
//! Both transports read a message with [`jsonrpc::parse`]. Bytes that are not JSON at all
//! (or not UTF-8, or nested deeper than the parser allows) are dropped here with a debug log,
//! as rmcp and the other MCP SDKs do: there is no id to answer, and answering garbage can
//! start an error storm with a peer that echoes it.

use std::collections::HashSet;
use std::future::Future;

use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, GetMeta, JsonRpcMessage,
    ProtocolVersion, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::Service;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::{RoleServer, ServiceExt};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::task::JoinSet;

use super::jsonrpc::{self, Incoming};
use super::ServeError;
use crate::mcp::CodeboxServer;

/// Longest line (one message) read from the client; a longer one is skipped whole and
/// logged, and the session goes on. Above `http.max_body_bytes`' default (which carries a
/// session call's largest upload in base64), so what HTTP accepts stdio accepts too.
const MAX_LINE_BYTES: usize = 48 * 1024 * 1024;

/// Serve one MCP session on stdio until the client closes stdin or `shutdown` resolves.
pub async fn serve(
    server: CodeboxServer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let supported = server.supported_protocol_versions().into_owned();
    let transport = LineTransport::new(tokio::io::stdin(), tokio::io::stdout(), supported);
    tokio::pin!(shutdown);
    let running = tokio::select! {
        running = server.serve(transport) => {
            running.map_err(|e| ServeError::Session(e.to_string()))?
        }
        _ = &mut shutdown => {
            tracing::info!("shutting down on signal before the client initialized the session");
            return Ok(());
        }
    };
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

/// Newline-delimited JSON-RPC on a reader and a writer: rmcp's writer, codebox's reader
/// (see the module doc for why).
pub struct LineTransport<R, W: AsyncWrite> {
    lines: Lines<BufReader<R>>,
    out: AsyncRwTransport<RoleServer, tokio::io::Empty, W>,
    /// Whether a request has started the session (until then rmcp's handshake accepts only
    /// requests).
    started: bool,
    supported: Vec<ProtocolVersion>,
    /// Ids of the requests passed on and not answered yet.
    in_flight: HashSet<RequestId>,
    /// Error answers being written; awaited before the writer closes.
    answering: JoinSet<()>,
}

impl<R, W> LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    /// `supported`: the protocol versions the server speaks (a request carrying one of them
    /// in its metadata starts a session without `initialize`, as in rmcp).
    pub fn new(read: R, write: W, supported: Vec<ProtocolVersion>) -> Self {
        LineTransport {
            lines: Lines::new(BufReader::new(read), MAX_LINE_BYTES),
            out: AsyncRwTransport::new_server(tokio::io::empty(), write),
            started: false,
            supported,
            in_flight: HashSet::new(),
            answering: JoinSet::new(),
        }
    }

    /// Answer on the side, so that `receive` stays cancel-safe (rmcp polls it in a
    /// `select!`); the writer's lock keeps whole lines.
    fn answer(&mut self, message: ServerJsonRpcMessage) {
        let sending = self.out.send(message);
        self.answering.spawn(async move {
            if let Err(e) = sending.await {
                tracing::debug!(error = %e, "cannot answer an invalid request");
            }
        });
        // Forget the sends that are done, so the set stays small in a long session.
        while self.answering.try_join_next().is_some() {}
    }

    /// Whether `request` starts rmcp's session: `initialize`, or (protocol 2026-07-28) a
    /// request whose metadata names a supported version.
    fn opens_session(&self, request: &ClientRequest) -> bool {
        match request {
            ClientRequest::InitializeRequest(_) => true,
            ClientRequest::PingRequest(_) | ClientRequest::DiscoverRequest(_) => false,
            other => {
                let meta = other.get_meta();
                meta.missing_required_keys(&ProtocolVersion::V_2026_07_28)
                    .is_empty()
                    && meta
                        .protocol_version()
                        .is_some_and(|v| self.supported.contains(&v))
            }
        }
    }
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: AsyncRead + Send + Unpin,
    W: AsyncWrite + Send + Unpin + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: ServerJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        match &item {
            JsonRpcMessage::Response(r) => {
                self.in_flight.remove(&r.id);
            }
            JsonRpcMessage::Error(e) => {
                if let Some(id) = &e.id {
                    self.in_flight.remove(id);
                }
            }
            _ => {}
        }
        self.out.send(item)
    }

    async fn receive(&mut self) -> Option<ClientJsonRpcMessage> {
        loop {
            let line = match self.lines.next().await {
                Line::Full(line) => line,
                Line::TooLong => {
                    tracing::warn!(
                        max_bytes = MAX_LINE_BYTES,
                        "a message longer than the limit was dropped"
                    );
                    continue;
                }
                Line::End => return None,
            };
            match jsonrpc::parse(&line) {
                Incoming::Message(message) => {
                    let message = *message;
                    match &message {
                        ClientJsonRpcMessage::Request(r) => {
                            if !self.in_flight.insert(r.id.clone()) {
                                let text = format!(
                                    "invalid request: the id {} is already used by a request that has not been answered; ids must be unique within a session",
                                    r.id
                                );
                                self.answer(jsonrpc::invalid(text, Some(r.id.clone())));
                                continue;
                            }
                            if !self.started {
                                self.started = self.opens_session(&r.request);
                            }
                        }
                        _ if !self.started => {
                            tracing::debug!(
                                "dropped a notification or response sent before initialize"
                            );
                            continue;
                        }
                        ClientJsonRpcMessage::Notification(n) => {
                            // A cancelled request's answer is never sent: forget its id.
                            if let ClientNotification::CancelledNotification(c) = &n.notification {
                                if let Some(id) = &c.params.request_id {
                                    self.in_flight.remove(id);
                                }
                            }
                        }
                        _ => {}
                    }
                    return Some(message);
                }
                Incoming::Invalid { answers, .. } => {
                    tracing::debug!(answers = answers.len(), "answered an invalid message");
                    for e in answers {
                        self.answer(e);
                    }
                }
                Incoming::NotJson(error) => {
                    tracing::debug!(%error, "ignored a line that is not JSON");
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        while self.answering.join_next().await.is_some() {}
        self.out.close().await
    }
}

/// One line read by [`Lines::next`].
enum Line {
    /// A line without its `\n` (or the last bytes before the end of input).
    Full(Vec<u8>),
    /// A line over the limit, skipped.
    TooLong,
    End,
}

/// `\n`-terminated lines of at most `max` bytes. A longer line is never held whole: it is
/// skipped as it arrives. Cancel-safe: a line read in part stays in `buf` for the next call.
struct Lines<R> {
    read: R,
    buf: Vec<u8>,
    max: usize,
    skipping: bool,
}

impl<R: AsyncBufRead + Unpin> Lines<R> {
    fn new(read: R, max: usize) -> Lines<R> {
        Lines {
            read,
            buf: Vec::new(),
            max,
            skipping: false,
        }
    }

    async fn next(&mut self) -> Line {
        loop {
            let available = match self.read.fill_buf().await {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read from the client");
                    return Line::End;
                }
            };
            if available.is_empty() {
                // The client closed its end: a last line without `\n` still counts.
                return if self.skipping || self.buf.is_empty() {
                    Line::End
                } else {
                    Line::Full(std::mem::take(&mut self.buf))
                };
            }
            let newline = available.iter().position(|b| *b == b'\n');
            let take = newline.map_or(available.len(), |i| i + 1);
            let mut line = None;
            if self.skipping {
                self.skipping = newline.is_none();
            } else if self.buf.len() + take > self.max + 1 {
                self.buf.clear();
                self.skipping = newline.is_none();
                line = Some(Line::TooLong);
            } else {
                let end = newline.unwrap_or(take);
                self.buf.extend_from_slice(&available[..end]);
                if newline.is_some() {
                    line = Some(Line::Full(std::mem::take(&mut self.buf)));
                }
            }
            self.read.consume(take);
            if let Some(line) = line {
                return line;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_over_the_limit_are_skipped_and_the_next_one_is_read() {
        let input = format!("{}\nshort\n{}\nlast", "x".repeat(40), "y".repeat(11));
        let mut lines = Lines::new(BufReader::with_capacity(4, input.as_bytes()), 10);
        assert!(matches!(lines.next().await, Line::TooLong));
        assert!(matches!(lines.next().await, Line::Full(l) if l == b"short"));
        assert!(matches!(lines.next().await, Line::TooLong));
        assert!(matches!(lines.next().await, Line::Full(l) if l == b"last"));
        assert!(matches!(lines.next().await, Line::End));
        let exact = format!("{}\n", "z".repeat(10));
        let mut lines = Lines::new(BufReader::with_capacity(3, exact.as_bytes()), 10);
        assert!(matches!(lines.next().await, Line::Full(l) if l.len() == 10));
    }
}
