//! MCP tool calls about another server's run or session (SPEC section 15): [`ClusterServer`]
//! wraps the tool server and forwards such a call as it is to that server's
//! `POST /cluster/tools/{tool}`, where [`answer_forwarded`] carries it out; the owner's result
//! is the client's. The tools themselves know nothing of the cluster.
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
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientJsonRpcMessage, ClientRequest,
    ContentBlock, GetMeta as _, JsonObject, ListToolsResult, NumberOrString,
    PaginatedRequestParams, ProgressNotificationParam, ProgressToken, Request, ServerConfig,
    ServerJsonRpcMessage, ServerNotification, ServerResult, Tool,
};
use rmcp::service::{serve_directly_with_ct, Peer as McpPeer, RequestContext};
use rmcp::transport::OneshotTransport;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use super::CodeboxServer;
use crate::cluster::{Cluster, Held, Peer, WAIT_SLACK};
use crate::contract::ids;
use crate::contract::params::MAX_WAIT_SECONDS;

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
/// Those of [`FORWARDED_TOOLS`] that name a run (`run_id`); the others name a session
/// (`session_id`, optional for `run_code` and `start_run`).
const RUN_TOOLS: [&str; 2] = ["get_result", "stop_run"];
/// The type of a forwarded `run_code`'s stream of progress lines and result.
pub const PROGRESS_STREAM: &str = "application/x-ndjson";

/// One line of a forwarded `run_code`'s stream.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StreamLine {
    Progress(ProgressNotificationParam),
    Result(CallToolResult),
}

/// The tool server of a member of a cluster: every request is the inner [`CodeboxServer`]'s,
/// except a call of one of [`FORWARDED_TOOLS`] about a run or session another server holds,
/// which is sent there. Without a cluster (`None`) it is the inner server.
///
/// It passes on the methods the inner server implements (`get_info` and its tools); rmcp's
/// defaults of the others read `get_info`. A method the inner server comes to implement is
/// passed on here too.
#[derive(Clone)]
pub struct ClusterServer {
    server: CodeboxServer,
    cluster: Option<Arc<Cluster>>,
}

impl ClusterServer {
    pub fn new(server: CodeboxServer, cluster: Option<Arc<Cluster>>) -> ClusterServer {
        ClusterServer { server, cluster }
    }

    pub fn server(&self) -> &CodeboxServer {
        &self.server
    }

    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }

    /// The result of `call` from the other server that holds its run or session, passing the
    /// owner's progress notifications on to the caller as they come; the caller's
    /// cancellation drops the call (the owner sees its caller leave, as it would a client).
    /// `None` when this server holds it, or no other server does, or the one that did can no
    /// longer answer for it ([`Cluster::released`]): this server answers then.
    async fn forwarded(
        &self,
        call: &CallToolRequestParams,
        context: &RequestContext<RoleServer>,
    ) -> Option<CallToolResult> {
        let cluster = self.cluster.as_ref()?;
        let tool = call.name.as_ref();
        if !FORWARDED_TOOLS.contains(&tool) {
            return None;
        }
        let args = call.arguments.as_ref()?;
        let named = |key: &str| args.get(key).and_then(serde_json::Value::as_str);
        let is_run = RUN_TOOLS.contains(&tool);
        let id = if is_run {
            ids::run_id(named("run_id")?)
        } else {
            named("session_id")?.to_string()
        };
        let what = if is_run {
            Held::Run(&id)
        } else {
            Held::Session(&id)
        };
        let peer = match what {
            Held::Run(id) => cluster.run_owner(self.server.manager(), id).await?,
            Held::Session(id) => cluster.session_owner(self.server.sessions(), id).await?,
        };
        let progress = match tool {
            "run_code" => context.meta.get_progress_token(),
            _ => None,
        };
        let progress = progress.map(|token| (token, context.peer.clone()));
        let ct = &context.ct;
        let result = tokio::select! {
            r = forward_call(cluster, &peer, tool, args, ct, progress) => r,
            _ = cluster.released(self.server.manager(), &peer, what) => return None,
        };
        Some(result.unwrap_or_else(|text| CallToolResult::error(vec![ContentBlock::text(text)])))
    }
}

impl ServerHandler for ClusterServer {
    fn get_info(&self) -> ServerConfig {
        self.server.get_info()
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.server.list_tools(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.server.get_tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if let Some(result) = self.forwarded(&request, &context).await {
            return Ok(result.into());
        }
        self.server.call_tool(request, context).await
    }
}

/// Carry out on `server` a call of `tool` (one of [`FORWARDED_TOOLS`]) with `args` that
/// another server forwarded: a request of its own to the tool server, as rmcp serves a
/// stateless HTTP request, never forwarded again. `ct` cancelled (the forwarding server left)
/// cancels it as a client's cancellation does (a `run_code` stops its run). `progress`: where
/// `run_code`'s progress notifications go (the forwarding server's stream), if its caller
/// asked for them.
pub async fn answer_forwarded(
    server: &CodeboxServer,
    tool: &str,
    args: serde_json::Value,
    ct: CancellationToken,
    progress: Option<tokio::sync::mpsc::Sender<ProgressNotificationParam>>,
) -> CallToolResult {
    let error = |text: String| CallToolResult::error(vec![ContentBlock::text(text)]);
    if !FORWARDED_TOOLS.contains(&tool) {
        return error(format!(
            "`{tool}` is not a tool another server forwards; those are {}",
            FORWARDED_TOOLS.join(", ")
        ));
    }
    let serde_json::Value::Object(args) = args else {
        return error(format!(
            "failed to deserialize parameters: the arguments are not a JSON object: {args}"
        ));
    };
    let call = CallToolRequestParams::new(tool.to_string()).with_arguments(args);
    let mut request = ClientRequest::CallToolRequest(Request::new(call));
    if progress.is_some() {
        // The token is the caller's, set by the server it called.
        let token = ProgressToken(NumberOrString::Number(0));
        request.get_meta_mut().set_progress_token(token);
    }
    let id = NumberOrString::Number(0);
    let (transport, mut answers) =
        OneshotTransport::<RoleServer>::new(ClientJsonRpcMessage::request(request, id));
    // Dropping it (this call dropped) cancels the request too.
    let _service = serve_directly_with_ct(server.clone(), transport, None, ct.child_token());
    while let Some(answer) = answers.recv().await {
        match answer {
            ServerJsonRpcMessage::Notification(n) => {
                if let (ServerNotification::ProgressNotification(p), Some(tx)) =
                    (n.notification, &progress)
                {
                    let _ = tx.send(p.params).await;
                }
            }
            ServerJsonRpcMessage::Response(r) => {
                return match r.result {
                    ServerResult::CallToolResult(result) => result,
                    other => error(format!("the tool answered with something else: {other:?}")),
                };
            }
            ServerJsonRpcMessage::Error(e) => return error(e.error.message.into_owned()),
            ServerJsonRpcMessage::Request(_) => {}
        }
    }
    error("the call was cancelled".to_string())
}

/// Send `tool(args)` to `peer` and return its result (see [`ClusterServer::forwarded`]).
async fn forward_call(
    cluster: &Cluster,
    peer: &Peer,
    tool: &str,
    args: &JsonObject,
    ct: &CancellationToken,
    progress: Option<(ProgressToken, McpPeer<RoleServer>)>,
) -> Result<CallToolResult, String> {
    if let Some(progress) = progress {
        return forward_streamed(cluster, peer, tool, args, ct, progress).await;
    }
    let args = serde_json::Value::Object(args.clone());
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
async fn forward_streamed(
    cluster: &Cluster,
    peer: &Peer,
    tool: &str,
    args: &JsonObject,
    ct: &CancellationToken,
    (token, caller): (ProgressToken, McpPeer<RoleServer>),
) -> Result<CallToolResult, String> {
    let body = serde_json::to_vec(args).map_err(|e| e.to_string())?;
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
