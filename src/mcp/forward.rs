//! MCP tool calls about another server's run or session (SPEC section 15): forwarded as they
//! are to that server's `POST /cluster/tools/{tool}`, where `CodeboxServer::call_here`
//! carries them out; the owner's result is the client's.
//!
//! A forwarded `run_code` whose caller asked for progress (a `progressToken`) asks the owner
//! for a stream (`Accept: application/x-ndjson`): one JSON line per progress notification
//! the owner would have sent its own client (`{"progress": {...}}`), then the result
//! (`{"result": {...}}`). Each notification is passed on to the caller under its own token
//! as it comes; the caller's cancellation drops the stream, which the owner takes for its
//! caller leaving (it stops the run).

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use http_body_util::BodyExt as _;
use rmcp::model::{CallToolResult, ProgressNotificationParam, ProgressToken};
use rmcp::service::Peer as McpPeer;
use rmcp::RoleServer;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cluster::{Cluster, Held, Peer, WAIT_SLACK};
use crate::contract::ids;
use crate::contract::params::MAX_WAIT_SECONDS;
use crate::sessions::Sessions;

/// Where a server takes the tool calls another forwards (`/cluster/tools/{tool}`).
pub const TOOLS_PATH: &str = "/cluster/tools";
/// The tools that name a run or a session, which another server may hold.
pub const FORWARDED_TOOLS: [&str; 6] = [
    "run_code",
    "start_run",
    "get_result",
    "stop_run",
    "read_session_file",
    "close_session",
];
/// The type of a forwarded `run_code`'s stream of progress lines and result.
pub const PROGRESS_STREAM: &str = "application/x-ndjson";

/// Where `run_code`'s progress notifications go: its own MCP client, or the stream of the
/// server that forwarded the call to this one.
pub(super) enum ProgressSink {
    Client(ProgressToken, McpPeer<RoleServer>),
    Stream(tokio::sync::mpsc::Sender<ProgressNotificationParam>),
}

impl ProgressSink {
    /// Send one notification (`progress` of `total` seconds, and what the run is doing).
    pub(super) async fn notify(&self, progress: f64, total: f64, message: String) {
        match self {
            ProgressSink::Client(token, peer) => {
                let p = ProgressNotificationParam::new(token.clone(), progress)
                    .with_total(total)
                    .with_message(message);
                let _ = peer.notify_progress(p).await;
            }
            ProgressSink::Stream(tx) => {
                // The token is the caller's, set by the server it called.
                let token = ProgressToken(rmcp::model::NumberOrString::Number(0));
                let p = ProgressNotificationParam::new(token, progress)
                    .with_total(total)
                    .with_message(message);
                let _ = tx.send(p).await;
            }
        }
    }
}

/// One line of a forwarded `run_code`'s stream.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamLine {
    Progress(ProgressNotificationParam),
    Result(CallToolResult),
}

/// This server's way to another server of its cluster: who holds a run or a session, and
/// the tool calls about it sent there.
#[derive(Clone)]
pub(super) struct Forwarder {
    cluster: Arc<Cluster>,
    sessions: Arc<Sessions>,
}

impl Forwarder {
    pub(super) fn new(cluster: Arc<Cluster>, sessions: Arc<Sessions>) -> Forwarder {
        Forwarder { cluster, sessions }
    }

    pub(super) fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// The other server that holds run `run_id`, if one does.
    pub(super) async fn run_owner(&self, run_id: &str) -> Option<Peer> {
        self.cluster
            .run_owner(self.sessions.runs(), &ids::run_id(run_id))
            .await
    }

    /// The other server that holds session `session_id`, if one does.
    pub(super) async fn session_owner(&self, session_id: &str) -> Option<Peer> {
        self.cluster.session_owner(&self.sessions, session_id).await
    }

    /// Send `tool(params)`, a call about `what`, to `peer` and return its result, passing the
    /// owner's progress notifications on to the caller (`progress`: its token and its MCP
    /// peer) as they come; `ct` cancelled drops the call (the owner sees its caller leave, as
    /// it would a client). `None` when `peer` can no longer answer for `what`
    /// ([`Cluster::released`]): this server answers then.
    pub(super) async fn forward<P: Serialize>(
        &self,
        peer: &Peer,
        what: Held<'_>,
        tool: &str,
        params: &P,
        ct: &CancellationToken,
        progress: Option<(ProgressToken, McpPeer<RoleServer>)>,
    ) -> Option<Result<CallToolResult, String>> {
        let cluster = &self.cluster;
        tokio::select! {
            r = forward_call(cluster, peer, tool, params, ct, progress) => Some(r),
            _ = cluster.released(self.sessions.runs(), peer, what) => None,
        }
    }
}

/// Send `tool(params)` to `peer` and return its result (see [`Forwarder::forward`]).
async fn forward_call<P: Serialize>(
    cluster: &Cluster,
    peer: &Peer,
    tool: &str,
    params: &P,
    ct: &CancellationToken,
    progress: Option<(ProgressToken, McpPeer<RoleServer>)>,
) -> Result<CallToolResult, String> {
    if let Some(progress) = progress {
        return forward_streamed(cluster, peer, tool, params, ct, progress).await;
    }
    let args = serde_json::to_value(params).map_err(|e| e.to_string())?;
    let timeout = (tool == "get_result").then(|| {
        let wait = args["wait_seconds"]
            .as_f64()
            .unwrap_or(0.0)
            .clamp(0.0, MAX_WAIT_SECONDS);
        Duration::from_secs_f64(wait) + WAIT_SLACK
    });
    let path = format!("{TOOLS_PATH}/{tool}");
    let call = cluster.call_json(peer, Method::POST, &path, Some(&args), timeout);
    let answer = tokio::select! {
        _ = ct.cancelled() => return Err("the call was cancelled".to_string()),
        a = call => a.map_err(|e| e.to_string())?,
    };
    if answer.status != StatusCode::OK {
        return Err(format!(
            "the codebox server holding it (instance {}) refused the forwarded call ({}): {}",
            peer.instance, answer.status, answer.body
        ));
    }
    serde_json::from_value(answer.body).map_err(|e| {
        format!(
            "the codebox server holding it (instance {}) answered something that is not a tool result: {e}",
            peer.instance
        )
    })
}

/// A forwarded call whose owner streams progress lines, then the result.
async fn forward_streamed<P: Serialize>(
    cluster: &Cluster,
    peer: &Peer,
    tool: &str,
    params: &P,
    ct: &CancellationToken,
    (token, caller): (ProgressToken, McpPeer<RoleServer>),
) -> Result<CallToolResult, String> {
    let body = serde_json::to_vec(params).map_err(|e| e.to_string())?;
    let mut headers = HeaderMap::new();
    headers.insert(header::ACCEPT, HeaderValue::from_static(PROGRESS_STREAM));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let path = format!("{TOOLS_PATH}/{tool}");
    let broke = |detail: String| {
        format!(
            "the codebox server holding it (instance {}) broke off its answer: {detail}; the run may still be going on there (get_result tells)",
            peer.instance
        )
    };
    let relay = async {
        let response = cluster
            .send(peer, Method::POST, &path, &headers, body.into(), None)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let mut body = response.into_body();
        if status != StatusCode::OK {
            let bytes = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(format!(
                "the codebox server holding it (instance {}) refused the forwarded call ({status}): {}",
                peer.instance,
                String::from_utf8_lossy(&bytes)
            ));
        }
        let mut pending: Vec<u8> = Vec::new();
        loop {
            let Some(frame) = body.frame().await else {
                return Err(broke("it ended without a result".into()));
            };
            let frame = frame.map_err(|e| broke(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            pending.extend_from_slice(&data);
            while let Some(at) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=at).collect();
                match serde_json::from_slice::<StreamLine>(&line) {
                    Ok(StreamLine::Progress(mut p)) => {
                        p.progress_token = token.clone();
                        let _ = caller.notify_progress(p).await;
                    }
                    Ok(StreamLine::Result(r)) => return Ok(r),
                    Err(e) => return Err(broke(format!("a line that is not JSON: {e}"))),
                }
            }
        }
    };
    tokio::select! {
        _ = ct.cancelled() => Err("the call was cancelled".to_string()),
        r = relay => r,
    }
}

/// A forwarded call's arguments, read as the tool reads them.
pub(super) fn parse<P: DeserializeOwned>(args: serde_json::Value) -> Result<P, String> {
    serde_path_to_error::deserialize(args).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            format!("failed to deserialize parameters: {inner}")
        } else {
            format!("failed to deserialize parameters: {path}: {inner}")
        }
    })
}

/// A typed result as rmcp's `Json` wrapper makes it.
pub(super) fn structured_result<T: Serialize>(
    json: rmcp::handler::server::wrapper::Json<T>,
) -> CallToolResult {
    CallToolResult::structured(serde_json::to_value(json.0).unwrap_or_default())
}

/// The typed value of a forwarded result (for the tools whose results are typed), or its
/// error text.
pub(super) fn structured<T: DeserializeOwned>(result: CallToolResult) -> Result<T, String> {
    if result.is_error == Some(true) {
        return Err(super::results::text_of(&result));
    }
    let value = result
        .structured_content
        .ok_or("the server holding it answered without a structured result")?;
    serde_json::from_value(value).map_err(|e| format!("the server holding it answered: {e}"))
}
