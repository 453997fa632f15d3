//! The submission routes: create (one or a batch) and show (one or a batch).

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::render::{render, token_of};
use super::validate::{add, validate, Errors, Valid};
use super::{refusal, segment, ALL_FIELDS, CODEBOX_STATUS, DEFAULT_FIELDS, MAX_BATCH};
use crate::api::{query_pairs, read_body, run_to_end, Api, BodyError, Client};
use crate::contract::ids::run_id_of;
use crate::report::RunReport;
use crate::runs::{LookupError, SubmitError};

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
        // Judge0's submissions name no session.
        Err(e @ SubmitError::Session(_)) => {
            let mut errors = Errors::new();
            add(&mut errors, "session_id", e.to_string());
            Err(Refused::Fields(errors))
        }
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

pub(super) async fn create(
    State(api): State<Api>,
    RawQuery(raw): RawQuery,
    client: Client,
    body: Body,
) -> Response {
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
    let report = match run_to_end(api.manager(), &run_id, &client).await {
        Ok(r) => r,
        Err(e) => return refusal(StatusCode::NOT_FOUND, &e.to_string()),
    };
    let sub = api.judge0.get(&run_id);
    let fields = o.fields.unwrap_or_else(|| DEFAULT_FIELDS.to_vec());
    let answer = render(&api, &report, sub.as_deref(), &fields, o.base64);
    (StatusCode::CREATED, Json(answer)).into_response()
}

pub(super) async fn show(
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

pub(super) async fn create_batch(
    State(api): State<Api>,
    RawQuery(raw): RawQuery,
    body: Body,
) -> Response {
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

pub(super) async fn show_batch(
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
