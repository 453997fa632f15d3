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

mod render;
mod store;
mod submissions;
mod validate;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use super::Api;
use crate::registry::Language;
pub use render::{judge0_strip, status_of, token_of};
pub use store::{Store, Submission, MAX_STORED_BYTES};
use submissions::{create, create_batch, show, show_batch};

/// The Judge0 version these routes answer as: clients map their language constants to ids
/// by it (`judge0.PYTHON` is 71 under 1.13.1).
const JUDGE0_VERSION: &str = "1.13.1";
/// Most submissions in one batch (Judge0's default `MAX_SUBMISSION_BATCH_SIZE`).
pub(crate) const MAX_BATCH: usize = 20;
/// Judge0's statuses, by id.
pub(crate) const STATUSES: [(u8, &str); 14] = [
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
pub(crate) const CODEBOX_STATUS: &str = "codebox_status";

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
pub(crate) const DEFAULT_FIELDS: [&str; 9] = [
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
    let (d, m) = (c.limits.defaults(), c.ceilings());
    let max_memory_kb = m.memory_mb * 1024;
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
