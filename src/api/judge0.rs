//! Judge0 CE 1.13.1 compatible routes: `GET /about`, `/config_info`, `/languages`,
//! `/languages/{id}`, `/statuses`, `POST /submissions`, `GET /submissions/{token}`,
//! `POST /submissions/batch` and `GET /submissions/batch?tokens=`, answered as Judge0 CE
//! 1.13.1 answers them, so Judge0's clients (the official Python SDK among them) work
//! unchanged.
//!
//! A submission is a run: its token is the run id as a hyphenated UUID (the 32-hex form is
//! accepted too). Judge0's statuses are derived from the run report (see
//! [`status_of`]); codebox's own status is in the extra field `codebox_status`. What Judge0
//! would store with a submission and codebox's report lacks (the source, stdin, expected
//! output, the limits as asked) is kept in memory beside the run, as long as reports are
//! kept ([`Store`]); after that, or after a restart, a submission answers from its report
//! alone. What codebox does not support (callbacks, additional files, compiler options,
//! per-process limits, network, `DELETE`) is refused as Judge0 refuses it when disabled.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::{query_pairs, read_body, run_to_end, Api, BodyError};
use crate::executor::outcome::signal_name;
use crate::executor::{LimitsInput, RunRequest};
use crate::registry::Language;
use crate::report::{RunReport, Stage, Status};
use crate::runs::{LookupError, SubmitError};

/// The Judge0 version these routes answer as: clients map their language constants to ids
/// by it (`judge0.PYTHON` is 71 under 1.13.1).
pub const JUDGE0_VERSION: &str = "1.13.1";
/// Most submissions in one batch (Judge0's default `MAX_SUBMISSION_BATCH_SIZE`).
pub const MAX_BATCH: usize = 20;
/// Most bytes of submissions (source, stdin, expected output) kept in memory; the oldest
/// go first.
pub const MAX_STORED_BYTES: usize = 64 * 1024 * 1024;
/// Judge0's longest `compiler_options` and `command_line_arguments`.
const MAX_OPTION_CHARS: usize = 512;

/// Judge0's statuses, by id.
pub const STATUSES: [(u8, &str); 14] = [
    (1, "In Queue"),
    (2, "Processing"),
    (3, "Accepted"),
    (4, "Wrong Answer"),
    (5, "Time Limit Exceeded"),
    (6, "Compilation Error"),
    (7, "Runtime Error (SIGSEGV)"),
    (8, "Runtime Error (SIGXFSZ)"),
    (9, "Runtime Error (SIGFPE)"),
    (10, "Runtime Error (SIGABRT)"),
    (11, "Runtime Error (NZEC)"),
    (12, "Runtime Error (Other)"),
    (13, "Internal Error"),
    (14, "Exec Format Error"),
];

/// codebox's own status of a submission's run: in the default answer, and wherever `fields`
/// names it, but not in `fields=*`, which is Judge0's attributes exactly (the official SDK
/// sets every attribute it gets on a model that refuses unknown ones).
pub const CODEBOX_STATUS: &str = "codebox_status";

/// Every field a submission has in Judge0 (`fields=*`), in Judge0's order.
pub const ALL_FIELDS: [&str; 35] = [
    "source_code",
    "language_id",
    "stdin",
    "expected_output",
    "stdout",
    "status_id",
    "created_at",
    "finished_at",
    "time",
    "memory",
    "stderr",
    "token",
    "number_of_runs",
    "cpu_time_limit",
    "cpu_extra_time",
    "wall_time_limit",
    "memory_limit",
    "stack_limit",
    "max_processes_and_or_threads",
    "enable_per_process_and_thread_time_limit",
    "enable_per_process_and_thread_memory_limit",
    "max_file_size",
    "compile_output",
    "exit_code",
    "exit_signal",
    "message",
    "wall_time",
    "compiler_options",
    "command_line_arguments",
    "redirect_stderr_to_stdout",
    "callback_url",
    "additional_files",
    "enable_network",
    "status",
    "language",
];

/// The fields answered when `fields` is not given.
pub const DEFAULT_FIELDS: [&str; 9] = [
    "token",
    "time",
    "memory",
    "stdout",
    "stderr",
    "compile_output",
    "message",
    "status",
    "codebox_status",
];

/// A refusal in Judge0's shape: `{error}`.
pub fn refusal(status: StatusCode, message: &str) -> Response {
    let mut r = (status, Json(json!({ "error": message }))).into_response();
    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS {
        r.headers_mut()
            .insert(header::RETRY_AFTER, super::v1::RETRY_AFTER_SECONDS.into());
    }
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        r.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

/// A request body as JSON, or its refusal (413 over the cap, 400 not JSON).
async fn json_body(api: &Api, body: Body) -> Result<Value, Response> {
    let bytes = read_body(body, api.max_body).await.map_err(|e| match e {
        BodyError::TooLarge(_) => refusal(StatusCode::PAYLOAD_TOO_LARGE, &e.message()),
        e => refusal(StatusCode::BAD_REQUEST, &e.message()),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| {
        refusal(
            StatusCode::BAD_REQUEST,
            &format!("the body is not JSON: {e}"),
        )
    })
}

/// What a submission asked for, kept beside its run.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    pub language_id: u32,
    pub source_code: String,
    pub stdin: Option<String>,
    pub expected_output: Option<String>,
    pub cpu_time_limit: f64,
    pub cpu_extra_time: f64,
    pub wall_time_limit: f64,
    pub memory_limit: i64,
    pub stack_limit: i64,
    pub max_processes_and_or_threads: i64,
    pub max_file_size: i64,
    pub command_line_arguments: Option<String>,
    pub redirect_stderr_to_stdout: bool,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

impl Submission {
    fn bytes(&self) -> usize {
        self.source_code.len()
            + self.stdin.as_ref().map_or(0, String::len)
            + self.expected_output.as_ref().map_or(0, String::len)
            + self.command_line_arguments.as_ref().map_or(0, String::len)
            + 256
    }
}

#[derive(Default)]
struct Stored {
    by_run: HashMap<String, Arc<Submission>>,
    /// Run ids oldest first, with when they were stored.
    order: VecDeque<(Instant, String)>,
    bytes: usize,
}

/// The submissions of this server, by run id: kept as long as reports are
/// (`runs.result_retention_seconds`) and within [`MAX_STORED_BYTES`].
pub struct Store {
    retention: Duration,
    stored: Mutex<Stored>,
}

impl Store {
    pub fn new(retention: Duration) -> Store {
        Store {
            retention,
            stored: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Stored> {
        self.stored.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, run_id: &str, submission: Submission) {
        let mut s = self.lock();
        s.bytes += submission.bytes();
        s.by_run.insert(run_id.to_string(), Arc::new(submission));
        s.order.push_back((Instant::now(), run_id.to_string()));
        while let Some((at, id)) = s.order.front().cloned() {
            if at.elapsed() < self.retention && s.bytes <= MAX_STORED_BYTES {
                break;
            }
            s.order.pop_front();
            if let Some(old) = s.by_run.remove(&id) {
                s.bytes -= old.bytes();
            }
        }
    }

    pub fn get(&self, run_id: &str) -> Option<Arc<Submission>> {
        self.lock().by_run.get(run_id).cloned()
    }
}

/// The routes, at the root (as Judge0 serves them).
pub fn router(api: Api) -> Router {
    Router::new()
        .route("/about", get(about))
        .route("/version", get(|| async { JUDGE0_VERSION }))
        .route("/config_info", get(config_info))
        .route("/statuses", get(statuses))
        .route("/languages", get(languages))
        .route("/languages/all", get(all_languages))
        .route("/languages/{id}", get(language))
        .route("/authenticate", post(|| async { StatusCode::OK }))
        .route(
            "/submissions",
            post(create).get(|| async {
                refusal(
                    StatusCode::FORBIDDEN,
                    "listing submissions needs Judge0's authorization token, which codebox does not have; use GET /v1/history",
                )
            }),
        )
        .route("/submissions/batch", post(create_batch).get(show_batch))
        .route("/submissions/{token}", get(show).delete(|| async {
            refusal(StatusCode::BAD_REQUEST, "delete not allowed")
        }))
        .method_not_allowed_fallback(|| async {
            refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "this route does not take that method",
            )
        })
        .with_state(api)
}

async fn about() -> Response {
    Json(json!({
        "version": JUDGE0_VERSION,
        "homepage": null,
        "source_code": null,
        "maintainer": format!("codebox {} (Judge0 CE {JUDGE0_VERSION} compatible routes)", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

/// Judge0's configuration, every field filled from codebox's settings.
pub fn config(api: &Api) -> Value {
    let c = api.manager().config();
    let (d, m) = (c.limits.defaults(), c.limits.ceilings());
    let max_memory_kb = m.memory_mb.min(c.runs.memory_budget_mb) * 1024;
    let file_kb = c.sandbox.max_file_size_mb * 1024;
    json!({
        "maintenance_mode": false,
        "enable_wait_result": true,
        "enable_compiler_options": false,
        "allowed_languages_for_compile_options": [],
        "enable_command_line_arguments": true,
        "enable_submission_delete": false,
        "enable_callbacks": false,
        "callbacks_max_tries": 0,
        "callbacks_timeout": 0.0,
        "enable_additional_files": false,
        "max_queue_size": c.runs.max_queued_runs,
        "cpu_time_limit": d.timeout_seconds,
        "max_cpu_time_limit": m.timeout_seconds,
        "cpu_extra_time": 0.0,
        "max_cpu_extra_time": m.timeout_seconds,
        "wall_time_limit": d.timeout_seconds,
        "max_wall_time_limit": m.timeout_seconds,
        "memory_limit": d.memory_mb * 1024,
        "max_memory_limit": max_memory_kb,
        "stack_limit": d.memory_mb * 1024,
        "max_stack_limit": max_memory_kb,
        "max_processes_and_or_threads": c.sandbox.pids_limit,
        "max_max_processes_and_or_threads": c.sandbox.pids_limit,
        "enable_per_process_and_thread_time_limit": false,
        "allow_enable_per_process_and_thread_time_limit": false,
        "enable_per_process_and_thread_memory_limit": false,
        "allow_enable_per_process_and_thread_memory_limit": false,
        "max_file_size": file_kb,
        "max_max_file_size": file_kb,
        "number_of_runs": 1,
        "max_number_of_runs": 1,
        "redirect_stderr_to_stdout": false,
        "max_extract_size": 0,
        "enable_batched_submissions": true,
        "max_submission_batch_size": MAX_BATCH,
        "submission_cache_duration": 0.0,
        "use_docs_as_homepage": false,
        "allow_enable_network": false,
        "enable_network": false,
    })
}

async fn config_info(State(api): State<Api>) -> Response {
    Json(config(&api)).into_response()
}

async fn statuses() -> Response {
    let list: Vec<Value> = STATUSES
        .iter()
        .map(|(id, d)| json!({ "id": id, "description": d }))
        .collect();
    Json(list).into_response()
}

/// Every (id, language) pair, sorted by name then id (Judge0 sorts by name).
fn ids(api: &Api) -> Vec<(u32, &Language)> {
    let mut out: Vec<(u32, &Language)> = api
        .manager()
        .registry()
        .languages
        .values()
        .flat_map(|l| l.judge0_ids.iter().map(move |id| (*id, l)))
        .collect();
    out.sort_by(|a, b| a.1.display_name.cmp(&b.1.display_name).then(a.0.cmp(&b.0)));
    out
}

async fn languages(State(api): State<Api>) -> Response {
    let list: Vec<Value> = ids(&api)
        .into_iter()
        .map(|(id, l)| json!({ "id": id, "name": l.display_name }))
        .collect();
    Json(list).into_response()
}

async fn all_languages(State(api): State<Api>) -> Response {
    let list: Vec<Value> = ids(&api)
        .into_iter()
        .map(|(id, l)| json!({ "id": id, "name": l.display_name, "is_archived": false }))
        .collect();
    Json(list).into_response()
}

/// A path parameter; one that is not UTF-8 once decoded names nothing (lossy is enough).
fn segment(path: Result<Path<String>, PathRejection>) -> String {
    path.map(|Path(s)| s).unwrap_or_else(|_| "?".to_string())
}

async fn language(State(api): State<Api>, path: Result<Path<String>, PathRejection>) -> Response {
    let id = segment(path);
    let found = id
        .parse::<i64>()
        .ok()
        .and_then(|n| api.manager().registry().by_judge0_id(n).map(|l| (n, l)));
    let Some((n, l)) = found else {
        return refusal(
            StatusCode::NOT_FOUND,
            &format!("language with id {id} doesn't exist; GET /languages lists them"),
        );
    };
    let argv = |a: &Option<Vec<String>>| a.as_ref().map(|a| a.join(" "));
    Json(json!({
        "id": n,
        "name": l.display_name,
        "is_archived": false,
        "source_file": l.source_file,
        "compile_cmd": argv(&l.compile).or_else(|| argv(&l.check)),
        "run_cmd": l.run.join(" "),
    }))
    .into_response()
}

/// Judge0's validation errors: `{field: [messages]}`.
type Errors = BTreeMap<String, Vec<String>>;

fn add(errors: &mut Errors, field: &str, message: impl Into<String>) {
    errors
        .entry(field.to_string())
        .or_default()
        .push(message.into());
}

/// A request's fields, read as loosely as Rails reads them (numbers may be strings).
struct Fields<'a> {
    map: &'a Map<String, Value>,
    errors: Errors,
}

impl Fields<'_> {
    fn text(&mut self, field: &str) -> Option<String> {
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                add(&mut self.errors, field, "must be a string");
                None
            }
        }
    }

    fn number(&mut self, field: &str) -> Option<f64> {
        let v = match self.map.get(field) {
            None | Some(Value::Null) => return None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) if s.trim().is_empty() => return None,
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            Some(_) => None,
        };
        match v.filter(|v| v.is_finite()) {
            Some(v) => Some(v),
            None => {
                add(&mut self.errors, field, "is not a number");
                None
            }
        }
    }

    fn boolean(&mut self, field: &str) -> Option<bool> {
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::String(s)) if s == "true" || s == "1" => Some(true),
            Some(Value::String(s)) if s == "false" || s == "0" || s.is_empty() => Some(false),
            Some(_) => {
                add(&mut self.errors, field, "must be true or false");
                None
            }
        }
    }

    /// A number within `min..=max` (`min_exclusive`: above `min`), else the default.
    fn bounded(
        &mut self,
        field: &str,
        min: f64,
        min_exclusive: bool,
        max: f64,
        default: f64,
    ) -> (f64, bool) {
        let Some(v) = self.number(field) else {
            return (default, false);
        };
        if min_exclusive && v <= min {
            add(
                &mut self.errors,
                field,
                format!("must be greater than {}", num(min)),
            );
        } else if !min_exclusive && v < min {
            add(
                &mut self.errors,
                field,
                format!("must be greater than or equal to {}", num(min)),
            );
        } else if v > max {
            add(
                &mut self.errors,
                field,
                format!("must be less than or equal to {}", num(max)),
            );
        }
        (v, true)
    }

    /// A text field, base64-decoded when the request says so.
    fn content(&mut self, field: &str, base64: bool) -> Option<String> {
        let text = self.text(field)?;
        if !base64 {
            return Some(text);
        }
        let cleaned: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        match engine.decode(cleaned.as_bytes()) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => Some(s),
                Err(_) => {
                    add(&mut self.errors, field, "is not UTF-8 text once decoded");
                    None
                }
            },
            Err(e) => {
                add(
                    &mut self.errors,
                    field,
                    format!("is not valid Base64 (base64_encoded=true): {e}"),
                );
                None
            }
        }
    }
}

/// A number as Rails writes it in messages (`15`, `0.5`).
fn num(v: f64) -> String {
    crate::report::fmt_num(v)
}

/// A submission that passed validation, and the run it becomes.
struct Valid {
    submission: Submission,
    run: RunRequest,
    /// Whether the timeout came from `wall_time_limit` (else from the CPU time limit).
    wall_given: bool,
}

/// Validate a submission as Judge0 does, and turn it into a run.
fn validate(api: &Api, value: &Value, base64: bool) -> Result<Valid, Errors> {
    let Some(map) = value.as_object() else {
        let mut errors = Errors::new();
        add(&mut errors, "submission", "must be a JSON object");
        return Err(errors);
    };
    let c = api.manager().config();
    let (d, m) = (c.limits.defaults(), c.limits.ceilings());
    let max_memory_kb = (m.memory_mb.min(c.runs.memory_budget_mb) * 1024) as f64;
    let file_kb = (c.sandbox.max_file_size_mb * 1024) as f64;
    let pids = c.sandbox.pids_limit as f64;
    let mut f = Fields {
        map,
        errors: Errors::new(),
    };
    let source_code = f.content("source_code", base64);
    let stdin = f.content("stdin", base64);
    let expected_output = f.content("expected_output", base64);
    if source_code.as_deref().is_none_or(|s| s.trim().is_empty())
        && !f.errors.contains_key("source_code")
    {
        add(&mut f.errors, "source_code", "can't be blank");
    }
    let language = match f.number("language_id") {
        None if !f.errors.contains_key("language_id") => {
            add(&mut f.errors, "language_id", "can't be blank");
            None
        }
        None => None,
        Some(n) => {
            let found = (n.fract() == 0.0)
                .then(|| api.manager().registry().by_judge0_id(n as i64))
                .flatten();
            if found.is_none() {
                add(
                    &mut f.errors,
                    "language_id",
                    format!("language with id {} doesn't exist", num(n)),
                );
            }
            found.map(|l| (n as u32, l))
        }
    };
    f.bounded("number_of_runs", 0.0, true, 1.0, 1.0);
    let (cpu, cpu_given) = f.bounded(
        "cpu_time_limit",
        0.0,
        false,
        m.timeout_seconds,
        d.timeout_seconds,
    );
    let (extra, extra_given) = f.bounded("cpu_extra_time", 0.0, false, m.timeout_seconds, 0.0);
    let (wall, wall_given) = f.bounded(
        "wall_time_limit",
        1.0,
        false,
        m.timeout_seconds,
        d.timeout_seconds,
    );
    let (memory_kb, memory_given) = f.bounded(
        "memory_limit",
        6144.0,
        false,
        max_memory_kb,
        (d.memory_mb * 1024) as f64,
    );
    let (stack, _) = f.bounded(
        "stack_limit",
        0.0,
        false,
        max_memory_kb,
        (d.memory_mb * 1024) as f64,
    );
    let (processes, _) = f.bounded("max_processes_and_or_threads", 0.0, true, pids, pids);
    let (file_size, _) = f.bounded("max_file_size", 0.0, false, file_kb, file_kb);
    for field in [
        "enable_per_process_and_thread_time_limit",
        "enable_per_process_and_thread_memory_limit",
    ] {
        if f.boolean(field) == Some(true) {
            add(&mut f.errors, field, "this option cannot be enabled");
        }
    }
    let redirect = f.boolean("redirect_stderr_to_stdout").unwrap_or(false);
    if f.boolean("enable_network") == Some(true) {
        add(
            &mut f.errors,
            "enable_network",
            "enabling network is not allowed",
        );
    }
    for (field, refused) in [
        (
            "compiler_options",
            "setting compiler options is not allowed",
        ),
        ("callback_url", "setting callback is not allowed"),
        (
            "additional_files",
            "setting additional files is not allowed",
        ),
    ] {
        let given = f.text(field).filter(|t| !t.trim().is_empty());
        if let Some(t) = given {
            if field == "compiler_options" && t.chars().count() > MAX_OPTION_CHARS {
                add(
                    &mut f.errors,
                    field,
                    "is too long (maximum is 512 characters)",
                );
            }
            add(&mut f.errors, field, refused);
        }
    }
    let arguments = f.text("command_line_arguments");
    if arguments
        .as_ref()
        .is_some_and(|a| a.chars().count() > MAX_OPTION_CHARS)
    {
        add(
            &mut f.errors,
            "command_line_arguments",
            "is too long (maximum is 512 characters)",
        );
    }
    let errors = f.errors;
    let (Some((language_id, lang)), Some(source_code), true) =
        (language, source_code, errors.is_empty())
    else {
        return Err(errors);
    };
    // wall_time_limit sets the run's timeout; without it, cpu_time_limit plus cpu_extra_time.
    let timeout = if wall_given {
        Some(wall)
    } else if cpu_given || extra_given {
        Some(cpu + extra)
    } else {
        None
    };
    let args: Vec<String> = arguments
        .as_deref()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let run = RunRequest {
        language: lang.id.clone(),
        code: source_code.clone(),
        stdin: stdin.clone(),
        args: (!args.is_empty()).then_some(args),
        limits: Some(LimitsInput {
            memory_mb: memory_given.then(|| (memory_kb / 1024.0).floor()),
            timeout_seconds: timeout,
            cpus: None,
        }),
        ..RunRequest::default()
    };
    Ok(Valid {
        submission: Submission {
            language_id,
            source_code,
            stdin,
            expected_output,
            cpu_time_limit: cpu,
            cpu_extra_time: extra,
            wall_time_limit: wall,
            memory_limit: memory_kb as i64,
            stack_limit: stack as i64,
            max_processes_and_or_threads: processes as i64,
            max_file_size: file_size as i64,
            command_line_arguments: arguments,
            redirect_stderr_to_stdout: redirect,
            created_at: chrono::Utc::now(),
        },
        run,
        wall_given,
    })
}

/// Why a valid submission was not accepted.
enum Refused {
    /// codebox's own validation, as Judge0's field errors (422).
    Fields(Errors),
    /// The queue is full or the server is stopping (503, retryable).
    Busy(String),
}

/// Submit a valid submission.
fn submit(api: &Api, valid: Valid) -> Result<String, Refused> {
    let wall_given = valid.wall_given;
    match api.manager().submit(valid.run) {
        Ok(accepted) => {
            api.judge0.insert(&accepted.run_id, valid.submission);
            Ok(accepted.run_id)
        }
        Err(SubmitError::Invalid(e)) => {
            let field = match e.field.as_str() {
                "code" => "source_code",
                "limits.memory_mb" => "memory_limit",
                "limits.timeout_seconds" if wall_given => "wall_time_limit",
                "limits.timeout_seconds" => "cpu_time_limit",
                "args" => "command_line_arguments",
                f if f.starts_with("args[") => "command_line_arguments",
                f => f,
            };
            let mut errors = Errors::new();
            add(&mut errors, field, e.message);
            Err(Refused::Fields(errors))
        }
        Err(e @ SubmitError::QueueFull { .. }) => Err(Refused::Busy(format!("queue is full: {e}"))),
        Err(e @ SubmitError::ShuttingDown) => Err(Refused::Busy(e.to_string())),
    }
}

/// The query options shared by the submission routes.
struct Options {
    base64: bool,
    wait: bool,
    fields: Option<Vec<&'static str>>,
    tokens: Option<String>,
}

/// The options of a query, or why they are wrong (a 400 in Judge0's shape).
fn options(raw: Option<&str>) -> Result<Options, String> {
    let mut o = Options {
        base64: false,
        wait: false,
        fields: None,
        tokens: None,
    };
    for (k, v) in query_pairs(raw) {
        match k.as_str() {
            "base64_encoded" => o.base64 = v == "true",
            "wait" => o.wait = v == "true",
            "tokens" => o.tokens = Some(v),
            "fields" => {
                let asked: Vec<&str> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|f| !f.is_empty())
                    .collect();
                let invalid: Vec<&str> = asked
                    .iter()
                    .copied()
                    .filter(|f| *f != "*" && *f != CODEBOX_STATUS && !ALL_FIELDS.contains(f))
                    .collect();
                if !invalid.is_empty() {
                    return Err(format!("invalid fields: [{}]", invalid.join(", ")));
                }
                let mut fields: Vec<&'static str> = ALL_FIELDS
                    .iter()
                    .copied()
                    .filter(|f| asked.contains(&"*") || asked.contains(f))
                    .collect();
                if asked.contains(&CODEBOX_STATUS) {
                    fields.push(CODEBOX_STATUS);
                }
                o.fields = (!fields.is_empty()).then_some(fields);
            }
            _ => {}
        }
    }
    Ok(o)
}

/// Judge0's trimming before comparing with `expected_output`: each line's trailing
/// whitespace, then the whole text's.
pub fn judge0_strip(text: &str) -> String {
    text.split('\n')
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

/// A run's Judge0 status id, from its report and the expected output.
pub fn status_of(r: &RunReport, expected: Option<&str>) -> u8 {
    match r.status {
        Status::Queued => 1,
        Status::Running => 2,
        Status::CompileError => 6,
        Status::TimedOut | Status::OutOfMemory if r.stage == Some(Stage::Compile) => 6,
        Status::Succeeded => match expected {
            Some(e) if judge0_strip(e) != judge0_strip(&r.stdout) => 4,
            _ => 3,
        },
        Status::TimedOut => 5,
        Status::Failed => match r.signal.as_deref() {
            None => 11,
            Some("SIGSEGV") => 7,
            Some("SIGXFSZ") => 8,
            Some("SIGFPE") => 9,
            Some("SIGABRT") => 10,
            Some(_) => 12,
        },
        Status::OutOfMemory => 12,
        Status::Stopped | Status::SandboxError => 13,
    }
}

/// A run id as a hyphenated UUID.
pub fn token_of(run_id: &str) -> String {
    uuid::Uuid::parse_str(run_id)
        .map(|u| u.hyphenated().to_string())
        .unwrap_or_else(|_| run_id.to_string())
}

/// The run id a token names: both forms of a UUID are accepted.
pub fn run_id_of(token: &str) -> Option<String> {
    let t = token.trim();
    (t.len() == 32 || t.len() == 36)
        .then(|| uuid::Uuid::parse_str(t).ok())
        .flatten()
        .map(|u| u.simple().to_string())
}

fn seconds(ms: Option<u64>) -> Value {
    ms.map_or(Value::Null, |ms| {
        json!(format!("{:.3}", ms as f64 / 1000.0))
    })
}

fn decimal(v: f64) -> Value {
    json!(format!("{v:.1}"))
}

/// A submission as Judge0 answers it: `fields` only, text fields base64 when asked.
fn render(
    api: &Api,
    r: &RunReport,
    sub: Option<&Submission>,
    fields: &[&str],
    base64: bool,
) -> Value {
    let registry = api.manager().registry();
    let lang = registry.resolve(&r.language);
    let language_id = sub
        .map(|s| s.language_id)
        .or_else(|| lang.and_then(|l| l.judge0_ids.first().copied()));
    let status = status_of(r, sub.and_then(|s| s.expected_output.as_deref()));
    let description = STATUSES
        .iter()
        .find(|(id, _)| *id == status)
        .map_or("", |(_, d)| *d);
    let finished = r.status.is_terminal();
    let ran = finished && status != 6;
    let text = |s: Option<String>| -> Value {
        match s.filter(|s| !s.is_empty()) {
            None => Value::Null,
            Some(s) if base64 => json!(base64::engine::general_purpose::STANDARD.encode(s)),
            Some(s) => json!(s),
        }
    };
    let redirect = sub.is_some_and(|s| s.redirect_stderr_to_stdout);
    let (stdout, stderr) = if redirect {
        (format!("{}{}", r.stdout, r.stderr), String::new())
    } else {
        (r.stdout.clone(), r.stderr.clone())
    };
    let compile_output = r.compile.as_ref().map(|c| {
        if r.stage == Some(Stage::Compile) && r.status == Status::TimedOut {
            "Compilation time limit exceeded.".to_string()
        } else {
            format!("{}{}", c.stdout, c.stderr)
        }
    });
    let killed = matches!(
        r.status,
        Status::TimedOut | Status::OutOfMemory | Status::Stopped
    );
    let signal = r
        .signal
        .as_deref()
        .or(killed.then_some("SIGKILL"))
        .and_then(|name| (1..=64).find(|n| signal_name(*n) == Some(name)));
    let compile_ms = r.compile.as_ref().map_or(0, |c| c.duration_ms);
    let c = api.manager().config();
    let d = c.limits.defaults();
    let created = sub.map(|s| s.created_at);
    let at =
        |t: chrono::DateTime<chrono::Utc>| json!(t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
    let mut all: BTreeMap<&str, Value> = BTreeMap::new();
    all.insert("source_code", text(sub.map(|s| s.source_code.clone())));
    all.insert("language_id", json!(language_id));
    all.insert("stdin", text(sub.and_then(|s| s.stdin.clone())));
    all.insert(
        "expected_output",
        text(sub.and_then(|s| s.expected_output.clone())),
    );
    all.insert("stdout", if ran { text(Some(stdout)) } else { Value::Null });
    all.insert("status_id", json!(status));
    all.insert("created_at", created.map_or(Value::Null, at));
    all.insert(
        "finished_at",
        match (created, finished) {
            (Some(t), true) => at(t + chrono::Duration::milliseconds(
                (r.queued_ms + r.duration_ms).min(i64::MAX as u64) as i64,
            )),
            _ => Value::Null,
        },
    );
    all.insert(
        "time",
        if ran {
            seconds(r.usage.cpu_time_ms)
        } else {
            Value::Null
        },
    );
    all.insert(
        "memory",
        if ran {
            json!(r.usage.peak_memory_kb)
        } else {
            Value::Null
        },
    );
    all.insert("stderr", if ran { text(Some(stderr)) } else { Value::Null });
    all.insert("token", json!(token_of(&r.run_id)));
    all.insert("number_of_runs", json!(1));
    all.insert(
        "cpu_time_limit",
        decimal(sub.map_or(d.timeout_seconds, |s| s.cpu_time_limit)),
    );
    all.insert(
        "cpu_extra_time",
        decimal(sub.map_or(0.0, |s| s.cpu_extra_time)),
    );
    all.insert(
        "wall_time_limit",
        decimal(sub.map_or(r.limits.timeout_seconds, |s| s.wall_time_limit)),
    );
    all.insert(
        "memory_limit",
        json!(sub.map_or(r.limits.memory_mb as i64 * 1024, |s| s.memory_limit)),
    );
    all.insert(
        "stack_limit",
        json!(sub.map_or(d.memory_mb as i64 * 1024, |s| s.stack_limit)),
    );
    all.insert(
        "max_processes_and_or_threads",
        json!(sub.map_or(c.sandbox.pids_limit, |s| s.max_processes_and_or_threads)),
    );
    all.insert("enable_per_process_and_thread_time_limit", json!(false));
    all.insert("enable_per_process_and_thread_memory_limit", json!(false));
    all.insert(
        "max_file_size",
        json!(sub.map_or(c.sandbox.max_file_size_mb as i64 * 1024, |s| s
            .max_file_size)),
    );
    all.insert("compile_output", text(compile_output));
    all.insert(
        "exit_code",
        if ran {
            json!(if signal.is_some() {
                0
            } else {
                r.exit_code.unwrap_or(0)
            })
        } else {
            Value::Null
        },
    );
    all.insert("exit_signal", if ran { json!(signal) } else { Value::Null });
    all.insert(
        "message",
        if ran && !matches!(status, 3 | 4) {
            text(Some(r.message.clone()))
        } else {
            Value::Null
        },
    );
    all.insert(
        "wall_time",
        if ran {
            seconds(Some(r.duration_ms.saturating_sub(compile_ms)))
        } else {
            Value::Null
        },
    );
    all.insert("compiler_options", Value::Null);
    all.insert(
        "command_line_arguments",
        json!(sub.and_then(|s| s.command_line_arguments.clone())),
    );
    all.insert("redirect_stderr_to_stdout", json!(redirect));
    all.insert("callback_url", Value::Null);
    all.insert("additional_files", Value::Null);
    all.insert("enable_network", json!(false));
    all.insert(
        "status",
        json!({ "id": status, "description": description }),
    );
    all.insert(
        "language",
        json!({ "id": language_id, "name": lang.map(|l| l.display_name.clone()) }),
    );
    all.insert(CODEBOX_STATUS, json!(r.status));
    let mut out = Map::new();
    for f in fields {
        if let Some(v) = all.remove(f) {
            out.insert(f.to_string(), v);
        }
    }
    Value::Object(out)
}

/// The report of a run as it stands, or `None` when codebox does not know it.
async fn report_now(api: &Api, run_id: &str) -> Option<RunReport> {
    match api.manager().wait(run_id, Duration::ZERO).await {
        Ok(r) => Some(r),
        Err(LookupError::Elsewhere { run_id, status, .. }) => {
            let c = api.manager().config();
            let language = api
                .judge0
                .get(&run_id)
                .and_then(|s| {
                    api.manager()
                        .registry()
                        .by_judge0_id(s.language_id as i64)
                        .map(|l| l.id.clone())
                })
                .unwrap_or_default();
            Some(RunReport::new(
                run_id,
                language,
                status,
                c.limits.defaults(),
                "held by another codebox server",
            ))
        }
        Err(_) => None,
    }
}

async fn create(State(api): State<Api>, RawQuery(raw): RawQuery, body: Body) -> Response {
    let o = match options(raw.as_deref()) {
        Ok(o) => o,
        Err(message) => return refusal(StatusCode::BAD_REQUEST, &message),
    };
    let value = match json_body(&api, body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let valid = match validate(&api, &value, o.base64) {
        Ok(v) => v,
        Err(errors) => return (StatusCode::UNPROCESSABLE_ENTITY, Json(errors)).into_response(),
    };
    let run_id = match submit(&api, valid) {
        Ok(id) => id,
        Err(Refused::Fields(errors)) => {
            return (StatusCode::UNPROCESSABLE_ENTITY, Json(errors)).into_response()
        }
        Err(Refused::Busy(message)) => return refusal(StatusCode::SERVICE_UNAVAILABLE, &message),
    };
    if !o.wait {
        return (
            StatusCode::CREATED,
            Json(json!({ "token": token_of(&run_id) })),
        )
            .into_response();
    }
    let report = match run_to_end(api.manager(), &run_id).await {
        Ok(r) => r,
        Err(e) => return refusal(StatusCode::NOT_FOUND, &e.to_string()),
    };
    let sub = api.judge0.get(&run_id);
    let fields = o.fields.unwrap_or_else(|| DEFAULT_FIELDS.to_vec());
    let answer = render(&api, &report, sub.as_deref(), &fields, o.base64);
    (StatusCode::CREATED, Json(answer)).into_response()
}

async fn show(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Response {
    let token = segment(path);
    let o = match options(raw.as_deref()) {
        Ok(o) => o,
        Err(message) => return refusal(StatusCode::BAD_REQUEST, &message),
    };
    let not_found = || {
        refusal(
            StatusCode::NOT_FOUND,
            &format!("no submission {token} is known to this server (submissions are kept for runs.result_retention_seconds after they end)"),
        )
    };
    let Some(run_id) = run_id_of(&token) else {
        return not_found();
    };
    let Some(report) = report_now(&api, &run_id).await else {
        return not_found();
    };
    let sub = api.judge0.get(&run_id);
    let fields = o.fields.unwrap_or_else(|| DEFAULT_FIELDS.to_vec());
    Json(render(&api, &report, sub.as_deref(), &fields, o.base64)).into_response()
}

async fn create_batch(State(api): State<Api>, RawQuery(raw): RawQuery, body: Body) -> Response {
    let o = match options(raw.as_deref()) {
        Ok(o) => o,
        Err(message) => return refusal(StatusCode::BAD_REQUEST, &message),
    };
    let value = match json_body(&api, body).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let items = value
        .get("submissions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if items.len() > MAX_BATCH {
        return refusal(
            StatusCode::BAD_REQUEST,
            &format!(
                "number of submissions in a batch should be less than or equal to {MAX_BATCH}"
            ),
        );
    }
    if items.is_empty() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "there should be at least one submission in a batch",
        );
    }
    let mut answers = Vec::new();
    let mut any = false;
    for item in &items {
        let answer = match validate(&api, item, o.base64) {
            Err(errors) => json!(errors),
            Ok(valid) => match submit(&api, valid) {
                Ok(run_id) => {
                    any = true;
                    json!({ "token": token_of(&run_id) })
                }
                Err(Refused::Fields(errors)) => json!(errors),
                Err(Refused::Busy(message)) => json!({ "error": [message] }),
            },
        };
        answers.push(answer);
    }
    let status = if any {
        StatusCode::CREATED
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    (status, Json(answers)).into_response()
}

async fn show_batch(
    State(api): State<Api>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
) -> Response {
    let o = match options(raw.as_deref()) {
        Ok(o) => o,
        Err(message) => return refusal(StatusCode::BAD_REQUEST, &message),
    };
    let tokens = headers
        .get("tokens")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(o.tokens)
        .unwrap_or_default();
    let tokens: Vec<&str> = tokens
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect();
    if tokens.len() > MAX_BATCH {
        return refusal(
            StatusCode::BAD_REQUEST,
            &format!(
                "number of submissions in a batch should be less than or equal to {MAX_BATCH}"
            ),
        );
    }
    if tokens.is_empty() {
        return refusal(
            StatusCode::BAD_REQUEST,
            "there should be at least one submission in a batch",
        );
    }
    let fields = o.fields.unwrap_or_else(|| DEFAULT_FIELDS.to_vec());
    let mut out = Vec::new();
    for t in tokens {
        let report = match run_id_of(t) {
            Some(id) => report_now(&api, &id).await,
            None => None,
        };
        out.push(match report {
            Some(r) => {
                let sub = api.judge0.get(&r.run_id);
                render(&api, &r, sub.as_deref(), &fields, o.base64)
            }
            None => Value::Null,
        });
    }
    Json(json!({ "submissions": out })).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge0_trims_each_line_and_the_end() {
        assert_eq!(judge0_strip("a  \nb\t\n\n"), "a\nb");
        assert_eq!(judge0_strip("a\r\nb"), "a\nb");
        assert_ne!(judge0_strip(" a"), judge0_strip("a"));
    }

    #[test]
    fn tokens_are_hyphenated_and_both_forms_name_the_run() {
        let run = "0123456789abcdef0123456789abcdef";
        let token = token_of(run);
        assert_eq!(token, "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(run_id_of(&token).as_deref(), Some(run));
        assert_eq!(run_id_of(run).as_deref(), Some(run));
        assert_eq!(run_id_of(&token.to_uppercase()).as_deref(), Some(run));
        assert_eq!(run_id_of("nope"), None);
        assert_eq!(run_id_of("{01234567-89ab-cdef-0123-456789abcdef}"), None);
    }

    #[test]
    fn statuses_follow_judge0s_ids() {
        let limits = crate::report::RunLimits {
            memory_mb: 64,
            timeout_seconds: 1.0,
            cpus: 1.0,
        };
        let report = |status, stage, signal: Option<&str>, stdout: &str| {
            let mut r = RunReport::new("r", "c", status, limits, "");
            r.stage = stage;
            r.signal = signal.map(str::to_string);
            r.stdout = stdout.to_string();
            r
        };
        let run = Some(Stage::Run);
        let compile = Some(Stage::Compile);
        for (r, expected, id) in [
            (report(Status::Queued, None, None, ""), None, 1),
            (report(Status::Running, None, None, ""), None, 2),
            (report(Status::Succeeded, run, None, "42\n"), None, 3),
            (
                report(Status::Succeeded, run, None, "42 \n\n"),
                Some("42"),
                3,
            ),
            (report(Status::Succeeded, run, None, "41\n"), Some("42"), 4),
            (report(Status::TimedOut, run, None, ""), None, 5),
            (report(Status::CompileError, compile, None, ""), None, 6),
            (report(Status::TimedOut, compile, None, ""), None, 6),
            (report(Status::OutOfMemory, compile, None, ""), None, 6),
            (report(Status::Failed, run, Some("SIGSEGV"), ""), None, 7),
            (report(Status::Failed, run, Some("SIGXFSZ"), ""), None, 8),
            (report(Status::Failed, run, Some("SIGFPE"), ""), None, 9),
            (report(Status::Failed, run, Some("SIGABRT"), ""), None, 10),
            (report(Status::Failed, run, None, ""), None, 11),
            (report(Status::Failed, run, Some("SIGTERM"), ""), None, 12),
            (report(Status::OutOfMemory, run, None, ""), None, 12),
            (report(Status::SandboxError, run, None, ""), None, 13),
        ] {
            assert_eq!(status_of(&r, expected), id, "{:?} {:?}", r.status, r.stage);
        }
    }
}
