//! The MCP tool server: the six tools of the contract, typed parameters and results (their
//! JSON schemas are derived from the Rust types), descriptions written from the running
//! configuration.
//!
//! A run that executed and failed is a normal result. Bad arguments, an unknown run id and a
//! full queue are tool errors (`isError: true`) whose text names the field.

pub mod params;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use rmcp::handler::server::common::schema_for_output;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Json;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ProgressNotificationParam, ResourceContents,
    ServerCapabilities, ServerConfig, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, RoleServer, ServerHandler};

use crate::catalog::{catalog, Catalog};
use crate::executor::{outputs, RunRequest};
use crate::history::{HistoryResult, Query, MAX_QUERY_LIMIT};
use crate::report::{fmt_num, RunReport, Status};
use crate::runs::{Accepted, RunManager, SubmitError};
pub use params::{GetResultParams, HistoryParams, Parameters, StopRunParams};

/// Longest `get_result` long-poll.
pub const MAX_WAIT_SECONDS: f64 = 60.0;
/// How often `run_code` reports progress.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// The tool server. One per MCP session; all share the run manager.
#[derive(Clone)]
pub struct CodeboxServer {
    manager: RunManager,
    tool_router: ToolRouter<Self>,
}

fn submit_error(e: SubmitError) -> String {
    match e {
        SubmitError::Invalid(e) => format!("invalid argument {e}"),
        other => other.to_string(),
    }
}

/// Formats JSON Schema defines; schemars also writes its own (`uint64`, `double`...), which
/// strict validators (the official TypeScript SDK's) warn about on every call.
const STANDARD_FORMATS: &[&str] = &[
    "date-time",
    "date",
    "time",
    "duration",
    "email",
    "idn-email",
    "hostname",
    "idn-hostname",
    "ipv4",
    "ipv6",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uuid",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];

/// A schema with only standard keywords' values: non-standard `format`s removed.
pub fn standard_schema(schema: &rmcp::model::JsonObject) -> rmcp::model::JsonObject {
    fn clean(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(o) => {
                let odd = matches!(o.get("format"), Some(serde_json::Value::String(f)) if !STANDARD_FORMATS.contains(&f.as_str()));
                if odd {
                    o.remove("format");
                }
                o.values_mut().for_each(clean);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(clean),
            _ => {}
        }
    }
    let mut v = serde_json::Value::Object(schema.clone());
    clean(&mut v);
    match v {
        serde_json::Value::Object(o) => o,
        _ => schema.clone(),
    }
}

/// `omitted_reason` of a file whose bytes travel as a content block of the same result.
pub const SENT_AS_BLOCK: &str = "sent as a content block";

/// A run report as a tool result. Each file's bytes travel once: a returned image is an image
/// block, any other returned file an embedded resource whose URI ends with its path, in the
/// order of the report's `files`; in the report itself (structured content, and the same JSON
/// as text) those files have `content_base64: null` and `omitted_reason: "sent as a content
/// block"`. `codebox run --json` and the history get the report from the run manager, not from
/// here.
pub fn report_result(mut report: RunReport) -> CallToolResult {
    let mut blocks = Vec::new();
    for f in &mut report.files {
        let Some(data) = f.content_base64.take() else {
            continue;
        };
        f.omitted_reason = Some(SENT_AS_BLOCK.to_string());
        if outputs::is_image(&f.mime_type) {
            blocks.push(ContentBlock::image(data, f.mime_type.clone()));
            continue;
        }
        let uri = format!("codebox://runs/{}/{}", report.run_id, f.path);
        let text = base64::engine::general_purpose::STANDARD
            .decode(&data)
            .ok()
            .and_then(|b| String::from_utf8(b).ok());
        blocks.push(ContentBlock::resource(match text {
            Some(text) => ResourceContents::TextResourceContents {
                uri,
                mime_type: Some(f.mime_type.clone()),
                text,
                meta: None,
            },
            None => ResourceContents::BlobResourceContents {
                uri,
                mime_type: Some(f.mime_type.clone()),
                blob: data,
                meta: None,
            },
        }));
    }
    let text = serde_json::to_string(&report).unwrap_or_default();
    let structured = serde_json::to_value(&report).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.extend(blocks);
    let mut result = CallToolResult::success(content);
    result.structured_content = Some(structured);
    result
}

/// The ids of the languages the server runs, sorted.
fn language_ids(manager: &RunManager) -> Vec<&str> {
    manager
        .registry()
        .languages
        .keys()
        .map(String::as_str)
        .collect()
}

impl CodeboxServer {
    /// The run-related argument text shared by `run_code` and `start_run`.
    fn run_arguments_text(manager: &RunManager) -> String {
        let c = manager.config();
        let (d, m) = (c.limits.defaults(), c.ceilings());
        let ids = language_ids(manager);
        let s = &c.sandbox;
        format!(
            "{n} languages: {ids}. Each run gets fresh containers with no network, a read-only root \
             filesystem and a non-root user; compiled languages compile first (a compiler failure is \
             status compile_error). The working directory is writable scratch of {ws} MB (memory); \
             files the program leaves under outputs/ come back in the report's `files` (at most \
             {of} files, {ob} bytes in all, {ofb} per file), images also as image content. \
             Limits (optional `limits` object): memory_mb default {dm} (max {mm}), \
             timeout_seconds default {dt} (max {mt}), cpus default {dc} (max {mc}); over a maximum is \
             rejected, never clamped. stdout and stderr are kept up to {out} bytes each. Code at most \
             {code} bytes; stdin at most {stdin} bytes; `files` at most {files} files, {fbytes} bytes in \
             all, relative paths only. `tests` (at most {mt_cases} cases of stdin, args and \
             expected_stdout) compiles once and runs each case in a fresh container; the report \
             then has `tests` and `tests_summary`. At most {conc} runs execute at once and the rest \
             wait in a queue of {queue}; when it is full the call fails and can be retried.",
            n = ids.len(),
            ws = s.workspace_mb,
            of = s.max_output_files,
            ob = s.max_output_bytes,
            ofb = s.max_output_file_bytes,
            mt_cases = crate::executor::request::MAX_TESTS,
            ids = ids.join(", "),
            dm = d.memory_mb,
            mm = m.memory_mb,
            dt = fmt_num(d.timeout_seconds),
            mt = fmt_num(m.timeout_seconds),
            dc = fmt_num(d.cpus),
            mc = fmt_num(m.cpus),
            out = s.output_limit_bytes,
            code = s.max_code_bytes,
            stdin = s.max_stdin_bytes,
            files = s.max_files,
            fbytes = s.max_files_bytes,
            conc = c.runs.max_concurrent_runs,
            queue = c.runs.max_queued_runs,
        )
    }

    pub fn new(manager: RunManager) -> CodeboxServer {
        let mut tool_router = Self::tool_router();
        let args = Self::run_arguments_text(&manager);
        let retention = manager.config().runs.result_retention_seconds;
        let descriptions = [
            (
                "run_code",
                format!(
                    "Run a program in a locked-down, throwaway Docker container and wait for the end. \
                     Returns the run report: status (succeeded, failed, compile_error, timed_out, \
                     out_of_memory, stopped, sandbox_error), exit_code, signal, stdout, stderr, compile \
                     output, durations and resource usage. A program that fails is a normal result, \
                     not an error. Sends progress notifications while it runs if the request carries a \
                     progress token; cancelling the call stops the run. {args} For long runs use \
                     start_run and get_result."
                ),
                ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(false),
            ),
            (
                "start_run",
                format!(
                    "Start a program like run_code but return at once with {{run_id, status, limits}}; \
                     poll get_result (with wait_seconds up to {MAX_WAIT_SECONDS:.0}) for the report and \
                     stop it with stop_run. {args}"
                ),
                ToolAnnotations::new().read_only(false).destructive(false).idempotent(false).open_world(false),
            ),
            (
                "get_result",
                format!(
                    "Get the report of a run started with start_run. While it is unfinished the report \
                     has status queued or running (with the time so far); with wait_seconds (0 to \
                     {MAX_WAIT_SECONDS:.0}, default 0) the call waits for the end, answering as soon as \
                     it comes. Reports are kept for {retention} s after a run ends; an unknown run_id is \
                     an error."
                ),
                ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false),
            ),
            (
                "stop_run",
                "Stop a run: a queued run ends at once, a running one is stopped and its containers \
                 removed right after; returns the final report (status stopped, with the output produced so far). \
                 On a run that already finished it returns that run's report unchanged, without error."
                    .to_string(),
                ToolAnnotations::new().read_only(false).destructive(true).idempotent(true).open_world(false),
            ),
            (
                "list_supported_languages",
                format!(
                    "List the {} supported languages (id, display name, aliases, Docker image, whether \
                     the image is present, source file name, whether it compiles, toolchain version, and \
                     `packages`: the libraries programs can use, e.g. numpy for Python; nothing can be \
                     installed at run time) and the default and maximum limits a run may ask for.",
                    manager.registry().languages.len()
                ),
                ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false),
            ),
            (
                "get_execution_history",
                format!(
                    "List past runs of this server, newest first: status, language, limits, durations, \
                     output sizes, code sha256 and code preview (no output text). Filters: limit (1 to \
                     {MAX_QUERY_LIMIT}, default 20), status, language."
                ),
                ToolAnnotations::new().read_only(true).destructive(false).idempotent(true).open_world(false),
            ),
        ];
        for (name, description, annotations) in descriptions {
            if let Some(route) = tool_router.map.get_mut(name) {
                route.attr.description = Some(description.into());
                route.attr.annotations = Some(annotations);
                if matches!(name, "run_code" | "start_run") {
                    let schema = Self::run_schema_with_numbers(&route.attr.input_schema, &manager);
                    route.attr.input_schema = Arc::new(schema);
                }
                // These return the report as built by `report_result`.
                if matches!(name, "run_code" | "get_result" | "stop_run") {
                    route.attr.output_schema = Some(schema_for_output::<RunReport>());
                }
            }
        }
        for route in tool_router.map.values_mut() {
            route.attr.input_schema = Arc::new(standard_schema(&route.attr.input_schema));
            if let Some(out) = &route.attr.output_schema {
                route.attr.output_schema = Some(Arc::new(standard_schema(out)));
            }
        }
        CodeboxServer {
            manager,
            tool_router,
        }
    }

    /// The run argument schema with the running config's numbers and language ids written
    /// into the field descriptions (the derived schema only has the static docs).
    fn run_schema_with_numbers(
        schema: &rmcp::model::JsonObject,
        manager: &RunManager,
    ) -> rmcp::model::JsonObject {
        let c = manager.config();
        let (d, m) = (c.limits.defaults(), c.ceilings());
        let ids = language_ids(manager);
        let mut schema = schema.clone();
        let mut describe = |path: &[&str], text: String| {
            let mut node = schema.get_mut(path[0]);
            for key in &path[1..] {
                node = node.and_then(|n| n.get_mut(*key));
            }
            if let Some(obj) = node.and_then(serde_json::Value::as_object_mut) {
                obj.insert("description".into(), serde_json::Value::String(text));
            }
        };
        describe(
            &["properties", "language"],
            format!(
                "Language id or alias, one of: {} (see list_supported_languages).",
                ids.join(", ")
            ),
        );
        let limits = ["$defs", "LimitsInput", "properties"];
        describe(
            &[limits[0], limits[1], limits[2], "memory_mb"],
            format!(
                "Memory limit in MB, a whole number; default {}, at most {} (swap is disabled).",
                d.memory_mb,
                m.memory_mb.min(c.runs.memory_budget_mb)
            ),
        );
        describe(
            &[limits[0], limits[1], limits[2], "timeout_seconds"],
            format!(
                "Wall-clock limit of the run stage in seconds; default {}, at least {}, at most {}.",
                fmt_num(d.timeout_seconds),
                fmt_num(crate::executor::request::MIN_TIMEOUT_SECONDS),
                fmt_num(m.timeout_seconds)
            ),
        );
        describe(
            &[limits[0], limits[1], limits[2], "cpus"],
            format!(
                "CPU quota in cores, may be fractional (e.g. 0.5); default {}, at most {}.",
                fmt_num(d.cpus),
                fmt_num(m.cpus)
            ),
        );
        schema
    }

    pub fn manager(&self) -> &RunManager {
        &self.manager
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
        let accepted = self.manager.submit(request).map_err(submit_error)?;
        let run_id = accepted.run_id;
        let token = ctx.meta.get_progress_token();
        let mut notified = 0.0_f64;
        loop {
            if let (Some(token), Some(p)) = (&token, self.manager.progress(&run_id)) {
                if !p.status.is_terminal() {
                    let done = (p.elapsed.as_secs_f64() * 10.0).round() / 10.0;
                    let done = if done > notified {
                        done
                    } else {
                        notified + 0.1
                    };
                    notified = done;
                    let message = match (p.status, p.queue_position) {
                        (Status::Queued, Some(pos)) => {
                            format!("queued: number {pos} waiting for a slot")
                        }
                        _ => format!("running for {:.0} s", p.elapsed.as_secs_f64()),
                    };
                    let _ = ctx
                        .peer
                        .notify_progress(
                            ProgressNotificationParam::new(token.clone(), done)
                                .with_total(p.budget.as_secs_f64().max(done))
                                .with_message(message),
                        )
                        .await;
                }
            }
            tokio::select! {
                _ = ctx.ct.cancelled() => {
                    tracing::info!(run_id, "run_code was cancelled by the client; stopping the run");
                    return self.manager.stop(&run_id).await.map(report_result).map_err(|e| e.to_string());
                }
                report = self.manager.wait(&run_id, PROGRESS_INTERVAL) => match report {
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
        self.manager.submit(request).map(Json).map_err(submit_error)
    }

    #[tool(description = "Get a run's report, optionally waiting for the end.")]
    async fn get_result(
        &self,
        Parameters(p): Parameters<GetResultParams>,
        ct: tokio_util::sync::CancellationToken,
    ) -> Result<CallToolResult, String> {
        let wait = p.wait_seconds.unwrap_or(0.0);
        if !(wait.is_finite() && (0.0..=MAX_WAIT_SECONDS).contains(&wait)) {
            return Err(format!(
                "invalid argument wait_seconds: must be between 0 and {MAX_WAIT_SECONDS:.0}; got {wait}"
            ));
        }
        let wait = Duration::from_secs_f64(wait);
        tokio::select! {
            _ = ct.cancelled() => Err("the call was cancelled".to_string()),
            r = self.manager.wait(&p.run_id, wait) => r.map(report_result).map_err(|e| e.to_string()),
        }
    }

    #[tool(description = "Stop a run.")]
    async fn stop_run(
        &self,
        Parameters(p): Parameters<StopRunParams>,
    ) -> Result<CallToolResult, String> {
        self.manager
            .stop(&p.run_id)
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

    #[tool(description = "List past runs, newest first.")]
    async fn get_execution_history(
        &self,
        Parameters(p): Parameters<HistoryParams>,
    ) -> Result<Json<HistoryResult>, String> {
        let limit = match p.limit {
            None => None,
            Some(n) if (1..=MAX_QUERY_LIMIT as i64).contains(&n) => Some(n as usize),
            Some(n) => {
                return Err(format!(
                    "invalid argument limit: must be between 1 and {MAX_QUERY_LIMIT}; got {n}"
                ))
            }
        };
        let status = match p.status.as_deref() {
            None => None,
            Some(s) => Some(Status::parse(s).ok_or_else(|| {
                let all: Vec<&str> = Status::ALL.iter().map(|s| s.as_str()).collect();
                format!(
                    "invalid argument status: `{s}` is not a status; use one of {}",
                    all.join(", ")
                )
            })?),
        };
        let language = p
            .language
            .map(|l| match self.manager.registry().resolve(&l) {
                Some(lang) => lang.id.clone(),
                None => l,
            });
        let Some(history) = self.manager.history() else {
            return Err("history: this server keeps no history".to_string());
        };
        history
            .query(Query {
                limit,
                status,
                language,
            })
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
                "codebox runs code in locked-down, throwaway Docker containers. Call \
                 list_supported_languages to see languages and limits; run_code runs a program and \
                 waits for its report; start_run + get_result(wait_seconds) + stop_run handle long runs; \
                 get_execution_history lists past runs.",
            )
    }
}
