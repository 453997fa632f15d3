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
//! Bytes that are not JSON at all (or not UTF-8, or nested deeper than the parser allows)
//! are dropped with a debug log, as rmcp and the other MCP SDKs do: there is no id to
//! answer, and answering garbage can start an error storm with a peer that echoes it.

use std::collections::HashSet;
use std::future::Future;

use rmcp::model::{
    ClientJsonRpcMessage, ClientNotification, ClientRequest, ErrorData, GetMeta, JsonRpcMessage,
    JsonRpcRequest, ProtocolVersion, RequestId, ServerJsonRpcMessage,
};
use rmcp::service::Service;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::{RoleServer, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncRead, AsyncWrite, BufReader};
use tokio::task::JoinSet;

use super::ServeError;
use crate::mcp::CodeboxServer;

/// Longest line (one message) read from the client; a longer one is skipped whole and
/// logged, and the session goes on. The same as rmcp's own stdio cap, and above
/// `http.max_body_bytes`' default, so what HTTP accepts stdio accepts too.
pub const MAX_LINE_BYTES: usize = 16 * 1024 * 1024;

/// Serve one MCP session on stdio until the client closes stdin or `shutdown` resolves.
pub async fn serve(
    server: CodeboxServer,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let supported = server.supported_protocol_versions().into_owned();
    let transport = LineTransport::new(tokio::io::stdin(), tokio::io::stdout(), supported);
    let running = server
        .serve(transport)
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
            match decode(&line) {
                Decoded::Message(message) => {
                    let message = *message;
                    match &message {
                        ClientJsonRpcMessage::Request(r) => {
                            if !self.in_flight.insert(r.id.clone()) {
                                let text = format!(
                                    "invalid request: the id {} is already used by a request that has not been answered; ids must be unique within a session",
                                    r.id
                                );
                                self.answer(invalid(text, Some(r.id.clone())));
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
                Decoded::Answer(errors) => {
                    for e in errors {
                        self.answer(e);
                    }
                }
                Decoded::Ignore => {}
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        while self.answering.join_next().await.is_some() {}
        self.out.close().await
    }
}

/// What one line is.
enum Decoded {
    Message(Box<ClientJsonRpcMessage>),
    /// JSON that is no valid message: the errors to answer it with.
    Answer(Vec<ServerJsonRpcMessage>),
    /// Blank, or not JSON.
    Ignore,
}

const BATCH: &str =
    "JSON-RPC batches are not supported by MCP; send each request on a line of its own";

fn decode(line: &[u8]) -> Decoded {
    let line = line.strip_prefix(b"\xef\xbb\xbf").unwrap_or(line);
    if line.trim_ascii().is_empty() {
        return Decoded::Ignore;
    }
    let error = match serde_json::from_slice::<ClientJsonRpcMessage>(line) {
        Ok(message) => return Decoded::Message(Box::new(message)),
        Err(e) => e,
    };
    let value = match error.classify() {
        serde_json::error::Category::Data => serde_json::from_slice::<Value>(line).ok(),
        _ => None,
    };
    let Some(value) = value else {
        tracing::debug!(%error, "ignored a line that is not JSON");
        return Decoded::Ignore;
    };
    let mut answers: Vec<ServerJsonRpcMessage> = match &value {
        Value::Array(items) => items
            .iter()
            .filter_map(request_id)
            .map(|id| invalid(BATCH.to_string(), Some(id)))
            .collect(),
        _ => request_id(&value)
            .map(|id| invalid(why_invalid(&value), Some(id)))
            .into_iter()
            .collect(),
    };
    if answers.is_empty() {
        // No request whose id can be read: one error without an id, as JSON-RPC says.
        answers.push(invalid(
            "not a valid JSON-RPC 2.0 message with a usable id".into(),
            None,
        ));
    }
    tracing::debug!(%error, answers = answers.len(), "answered an invalid message");
    Decoded::Answer(answers)
}

/// The id of a request (an object with a `method`), when a JSON-RPC id can be read from it:
/// a string or an integer.
fn request_id(v: &Value) -> Option<RequestId> {
    let o = v.as_object()?;
    o.get("method")?;
    RequestId::deserialize(o.get("id")?).ok()
}

/// Why a request with a readable id is not valid, in the parser's words.
fn why_invalid(v: &Value) -> String {
    let method = match v.get("method").and_then(Value::as_str) {
        Some(m) => format!(" `{}`", m.chars().take(100).collect::<String>()),
        None => String::new(),
    };
    match serde_json::from_value::<JsonRpcRequest<ClientRequest>>(v.clone()) {
        Err(e) => format!("invalid request{method}: {e}"),
        Ok(_) => format!("invalid request{method}"),
    }
}

fn invalid(message: String, id: Option<RequestId>) -> ServerJsonRpcMessage {
    ServerJsonRpcMessage::error(ErrorData::invalid_request(message, None), id)
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
    use serde_json::json;

    fn answers(line: &str) -> Vec<Value> {
        match decode(line.as_bytes()) {
            Decoded::Answer(a) => a
                .into_iter()
                .map(|m| serde_json::to_value(m).unwrap())
                .collect(),
            Decoded::Message(_) => panic!("{line} decoded as a message"),
            Decoded::Ignore => Vec::new(),
        }
    }

    #[test]
    fn an_invalid_request_is_answered_with_its_own_id() {
        for (line, id) in [
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":"x"}"#,
                json!(3),
            ),
            (r#"{"jsonrpc":"1.0","id":"a","method":"ping"}"#, json!("a")),
            (r#"{"id":4,"method":"ping"}"#, json!(4)),
        ] {
            let a = answers(line);
            assert_eq!(a.len(), 1, "{line}");
            assert_eq!(a[0]["id"], id, "{line}: {}", a[0]);
            assert_eq!(a[0]["error"]["code"], -32600);
        }
    }

    #[test]
    fn each_request_of_a_batch_gets_an_error_with_its_id() {
        let a = answers(
            r#"[{"jsonrpc":"2.0","id":6,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"},{"jsonrpc":"2.0","id":"x","method":"tools/list"},42]"#,
        );
        let ids: Vec<&Value> = a.iter().map(|m| &m["id"]).collect();
        assert_eq!(ids, [&json!(6), &json!("x")]);
        assert!(a[0]["error"]["message"].as_str().unwrap().contains("batch"));
    }

    #[test]
    fn messages_without_a_readable_id_get_one_anonymous_error_and_garbage_none() {
        for line in [
            r#"{"jsonrpc":"2.0","id":1.5,"method":"ping"}"#,
            r#"{"jsonrpc":"2.0","id":null,"method":"ping"}"#,
            "42",
            "[]",
        ] {
            let a = answers(line);
            assert_eq!(a.len(), 1, "{line}");
            assert!(a[0].get("id").is_none(), "{line}: {}", a[0]);
        }
        for line in ["{", "\u{feff}", "   ", r#"{"a":"\ud800"}"#, "NaN"] {
            assert!(answers(line).is_empty(), "{line}");
        }
        assert!(matches!(
            decode(b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}"),
            Decoded::Message(_)
        ));
        assert!(matches!(
            decode(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"\xff\"}"),
            Decoded::Ignore
        ));
    }

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
