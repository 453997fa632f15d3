//! The MCP tool server: the tools of the contract, typed parameters and results (their JSON
//! schemas are derived from the Rust types), descriptions written from the running
//! configuration ([`describe`], [`schema`]), results built in [`results`]. Each tool exists
//! once, in [`CodeboxServer`], and works on this server; in a cluster, [`ClusterServer`]
//! (`forward.rs`) wraps it and forwards a call about another server's run or session there.
//!
//! A run that executed and failed is a normal result. Bad arguments, an unknown run or session
//! id and a full queue are tool errors (`isError: true`) whose text names the field.

pub mod describe;
mod forward;
pub mod params;
pub mod results;
pub mod schema;

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Json;
use rmcp::model::{
    CallToolResult, Implementation, ProgressNotificationParam, ProgressToken, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};
use tokio_util::sync::CancellationToken;

use crate::catalog::{catalog, Catalog};
use crate::contract::answers::SessionFileResult;
use crate::contract::params::{
    check_wait, GetResultParams, HistoryParams, ReadSessionFileParams, SessionIdParams,
    StopRunParams,
};
use crate::contract::schema::standard_schema;
use crate::contract::SessionError;
use crate::contract::{ids, RunRequest, SessionRequest};
use crate::history::{HistoryResult, Query};
use crate::report::{RunReport, Status};
use crate::runs::{Accepted, RunManager, SubmitError};
use crate::sessions::{Closed, SessionInfo, SessionList, Sessions};
pub use forward::{
    answer_forwarded, ClusterServer, StreamLine, FORWARDED_TOOLS, PROGRESS_STREAM, TOOLS_PATH,
};
pub(crate) use params::Parameters;
pub(crate) use results::{report_result, session_file_result};

/// How often `run_code` reports progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);
/// How long one wait of `run_code` for its run lasts when it reports no progress.
const RUN_WAIT: Duration = Duration::from_secs(60);
/// The newest output a progress message carries: at most this many lines...
const PROGRESS_LINES: usize = 10;
/// ...and this many bytes.
const PROGRESS_BYTES: usize = 1024;

/// The tool server. One per MCP session; all share the run manager. Each tool carries out its
/// call on this server; in a cluster, [`ClusterServer`] wraps it and forwards the calls about
/// another server's run or session there.
#[derive(Clone)]
pub struct CodeboxServer {
    manager: RunManager,
    sessions: Arc<Sessions>,
    tool_router: ToolRouter<Self>,
}

impl CodeboxServer {
    /// The MCP server of these sessions and of the runs they run on.
    pub fn new(sessions: Arc<Sessions>) -> CodeboxServer {
        let manager = sessions.runs().clone();
        let mut tool_router = Self::tool_router();
        let run_schema = tool_router
            .map
            .get("run_code")
            .map(|r| schema::run_schema(&r.attr.input_schema, &manager));
        for d in describe::descriptions(&manager) {
            let Some(route) = tool_router.map.get_mut(d.name) else {
                continue;
            };
            route.attr.description = Some(d.description.into());
            route.attr.annotations = Some(d.annotations);
            if let Some(run) = &run_schema {
                match d.name {
                    "run_code" => route.attr.input_schema = Arc::new(run.clone()),
                    "start_run" => {
                        route.attr.input_schema = Arc::new(schema::start_run_schema(run))
                    }
                    _ => {}
                }
            }
            // These return the report as built by `report_result`.
            if matches!(d.name, "run_code" | "get_result" | "stop_run") {
                route.attr.output_schema = Some(schema_for_output::<RunReport>());
            }
            if d.name == "read_session_file" {
                route.attr.output_schema = Some(schema_for_output::<SessionFileResult>());
            }
        }
        for route in tool_router.map.values_mut() {
            let input = schema::compact(&route.attr.input_schema);
            route.attr.input_schema = Arc::new(standard_schema(&input));
            if let Some(out) = &route.attr.output_schema {
                route.attr.output_schema = Some(Arc::new(standard_schema(out)));
            }
        }
        CodeboxServer {
            manager,
            sessions,
            tool_router,
        }
    }

    pub fn manager(&self) -> &RunManager {
        &self.manager
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    /// A refused request as a tool error's text; a session the server does not know is
    /// looked up in the history first.
    async fn submit_error(&self, e: SubmitError) -> String {
        match e {
            SubmitError::Invalid(e) => format!("invalid argument {e}"),
            SubmitError::Session(e) => self.session_error(e).await,
            other => other.to_string(),
        }
    }

    async fn session_error(&self, e: SessionError) -> String {
        match self.sessions.explain(e).await {
            SessionError::Invalid(e) => format!("invalid argument {e}"),
            other => other.to_string(),
        }
    }

    /// Tell the client how run `run_id` is doing (a progress notification under `token`);
    /// `notified` is the progress told last, which each notification must exceed.
    async fn notify_progress(
        &self,
        run_id: &str,
        (token, peer): &(ProgressToken, Peer<RoleServer>),
        notified: &mut f64,
    ) {
        let Some(p) = self.manager.progress(run_id) else {
            return;
        };
        if p.status.is_terminal() {
            return;
        }
        let done = (p.elapsed.as_secs_f64() * 10.0).round() / 10.0;
        let done = if done > *notified {
            done
        } else {
            *notified + 0.1
        };
        *notified = done;
        let message = match (p.status, p.queue_position) {
            (Status::Queued, Some(pos)) => format!("queued: number {pos} waiting for a slot"),
            _ => {
                let mut m = format!("running for {:.0} s", p.elapsed.as_secs_f64());
                let tail = self
                    .manager
                    .feed(run_id)
                    .map(|f| f.tail(PROGRESS_LINES, PROGRESS_BYTES))
                    .unwrap_or_default();
                if !tail.is_empty() {
                    m.push_str("; newest output:\n");
                    m.push_str(&tail);
                }
                m
            }
        };
        let note = ProgressNotificationParam::new(token.clone(), done)
            .with_total(p.budget.as_secs_f64().max(done))
            .with_message(message);
        let _ = peer.notify_progress(note).await;
    }
}

#[tool_router]
impl CodeboxServer {
    #[tool(description = "Run a program and wait for its report.")]
    async fn run_code(
        &self,
        Parameters(request): Parameters<RunRequest>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, String> {
        let progress = ctx
            .meta
            .get_progress_token()
            .map(|token| (token, ctx.peer.clone()));
        let accepted = match self.sessions.submit(request) {
            Ok(a) => a,
            Err(e) => return Err(self.submit_error(e).await),
        };
        let run_id = accepted.run_id;
        let mut notified = 0.0_f64;
        // Without a progress token nothing is told on the way: one wait until the end.
        let nap = if progress.is_some() {
            PROGRESS_INTERVAL
        } else {
            RUN_WAIT
        };
        loop {
            if let Some(progress) = &progress {
                self.notify_progress(&run_id, progress, &mut notified).await;
            }
            tokio::select! {
                _ = ctx.ct.cancelled() => {
                    tracing::info!(run_id, "run_code was cancelled by the client; stopping the run");
                    return self.manager.stop(&run_id).await.map(report_result).map_err(|e| e.to_string());
                }
                report = self.manager.wait(&run_id, nap) => match report {
                    Ok(r) if r.status.is_terminal() => return Ok(report_result(r)),
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
        }
    }

    #[tool(description = "Start a program and return its run id at once.")]
    async fn start_run(
        &self,
        Parameters(request): Parameters<RunRequest>,
    ) -> Result<Json<Accepted>, String> {
        match self.sessions.submit(request) {
            Ok(a) => Ok(Json(a)),
            Err(e) => Err(self.submit_error(e).await),
        }
    }

    #[tool(description = "Get a run's report, optionally waiting for the end.")]
    async fn get_result(
        &self,
        Parameters(p): Parameters<GetResultParams>,
        ct: CancellationToken,
    ) -> Result<CallToolResult, String> {
        let wait = check_wait(p.wait_seconds).map_err(|e| format!("invalid argument {e}"))?;
        let run_id = ids::run_id(&p.run_id);
        tokio::select! {
            _ = ct.cancelled() => Err("the call was cancelled".to_string()),
            r = self.manager.wait(&run_id, wait) => r.map(report_result).map_err(|e| e.to_string()),
        }
    }

    #[tool(description = "Stop a run.")]
    async fn stop_run(
        &self,
        Parameters(p): Parameters<StopRunParams>,
    ) -> Result<CallToolResult, String> {
        self.manager
            .stop(&ids::run_id(&p.run_id))
            .await
            .map(report_result)
            .map_err(|e| e.to_string())
    }

    #[tool(description = "List the supported languages and limits.")]
    async fn list_supported_languages(&self) -> Result<Json<Catalog>, String> {
        let m = &self.manager;
        catalog(m.executor().engine().as_ref(), m.registry(), m.config())
            .await
            .map(Json)
            .map_err(|e| format!("listing the languages failed: {e}"))
    }

    #[tool(description = "Open a session.")]
    async fn create_session(
        &self,
        Parameters(request): Parameters<SessionRequest>,
    ) -> Result<Json<SessionInfo>, String> {
        match self.sessions.create(request).await {
            Ok(info) => Ok(Json(info)),
            Err(e) => Err(self.session_error(e).await),
        }
    }

    #[tool(description = "Read a session's file.")]
    async fn read_session_file(
        &self,
        Parameters(p): Parameters<ReadSessionFileParams>,
    ) -> Result<CallToolResult, String> {
        let offset = match p.offset {
            None => 0,
            Some(o) if o >= 0 => o as u64,
            Some(o) => {
                return Err(format!(
                    "invalid argument offset: must be 0 or more; got {o}"
                ))
            }
        };
        let max_bytes = match p.max_bytes {
            None => None,
            Some(m) if m > 0 => Some(m as u64),
            Some(m) => {
                return Err(format!(
                    "invalid argument max_bytes: must be positive; got {m}"
                ))
            }
        };
        match self
            .sessions
            .read(&p.session_id, &p.path, offset, max_bytes)
            .await
        {
            Ok(f) => Ok(session_file_result(f, &p.session_id)),
            Err(e) => Err(self.session_error(e).await),
        }
    }

    #[tool(description = "List the open sessions.")]
    async fn list_sessions(&self) -> Result<Json<SessionList>, String> {
        Ok(Json(self.sessions.list()))
    }

    #[tool(description = "Close a session.")]
    async fn close_session(
        &self,
        Parameters(p): Parameters<SessionIdParams>,
    ) -> Result<Json<Closed>, String> {
        match self.sessions.close_removed(&p.session_id).await {
            Ok(c) => Ok(Json(c)),
            Err(e) => Err(self.session_error(e).await),
        }
    }

    #[tool(description = "List past runs, newest first.")]
    async fn get_execution_history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
    ) -> Result<Json<HistoryResult>, String> {
        let f = p
            .check(self.manager.registry())
            .map_err(|e| format!("invalid argument {e}"))?;
        let Some(history) = self.manager.history() else {
            return Err("history: this server keeps no history".to_string());
        };
        history
            .query(Query::from(f))
            .await
            .map(|runs| Json(HistoryResult { runs }))
            .map_err(|e| format!("history: {e}"))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for CodeboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("codebox", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "codebox runs code in locked-down, throwaway Docker containers. \
                 list_supported_languages shows languages and limits; run_code runs a program and \
                 waits for its report; start_run + get_result + stop_run handle long runs; \
                 create_session keeps files and interpreter state across run_code calls; \
                 get_execution_history lists past runs.",
            )
    }
}
