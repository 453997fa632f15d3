//! `/v1`: codebox's own JSON API. The same arguments, reports and errors as the MCP tools,
//! over plain HTTP:
//! - `POST /v1/runs`: `run_code`'s arguments; waits and answers the report (200), or with
//!   `"wait": false` answers `202 {run_id, status, limits}` at once;
//! - `GET /v1/runs/{id}[?wait_seconds=N]`: `get_result`; `DELETE /v1/runs/{id}`: `stop_run`;
//! - `GET /v1/languages`, `GET /v1/history`, `GET /v1/openapi.json`;
//! - `/v1/sessions...`: see [`super::sessions`].
//!
//! An accepted request answers 200 with its report whatever the report's status. Refusals
//! are `{error: {code, message, field?}}` with the status of [`V1Error`].

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use schemars::JsonSchema;
use serde::Serialize;

use super::{from_value, query_pairs, read_body, run_to_end, Api, BodyError, Client};
use crate::catalog::catalog;
use crate::contract::ids;
use crate::executor::RunRequest;
use crate::mcp::{query_history, HistoryParams, HistoryQueryError, MAX_WAIT_SECONDS};
use crate::runs::sessions::SessionError;
use crate::runs::{LookupError, SubmitError};

/// Seconds a client is told to wait (`Retry-After`) after a full queue.
pub const RETRY_AFTER_SECONDS: u64 = 5;

/// The body of every refusal.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ErrorDetail {
    /// `invalid_argument` (400), `unauthorized` (401), `forbidden` (403), `not_found` (404),
    /// `method_not_allowed` (405), `conflict` or `session_ended` (409), `too_large` (413),
    /// `queue_full` or `sessions_full` (429), `engine_unavailable` (503).
    pub code: String,
    /// What went wrong and what to do.
    pub message: String,
    /// The argument at fault (`limits.memory_mb`), for `invalid_argument`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
}

/// A refusal of a `/v1` request.
#[derive(Debug, Clone)]
pub struct V1Error {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    pub field: Option<String>,
}

impl V1Error {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> V1Error {
        V1Error {
            status,
            code,
            message: message.into(),
            field: None,
        }
    }

    /// 400 `invalid_argument` naming `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> V1Error {
        V1Error {
            field: Some(field.into()),
            ..V1Error::new(StatusCode::BAD_REQUEST, "invalid_argument", message.into())
        }
    }

    pub fn unauthorized() -> V1Error {
        V1Error::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token: send `Authorization: Bearer <token>`",
        )
    }

    pub fn not_found(message: impl Into<String>) -> V1Error {
        V1Error::new(StatusCode::NOT_FOUND, "not_found", message)
    }
}

impl From<BodyError> for V1Error {
    fn from(e: BodyError) -> V1Error {
        match e {
            BodyError::TooLarge(_) => {
                V1Error::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", e.message())
            }
            BodyError::Unreadable => {
                V1Error::new(StatusCode::BAD_REQUEST, "invalid_argument", e.message())
            }
            BodyError::Invalid { field, message } => V1Error {
                field,
                ..V1Error::new(StatusCode::BAD_REQUEST, "invalid_argument", message)
            },
        }
    }
}

impl From<SubmitError> for V1Error {
    fn from(e: SubmitError) -> V1Error {
        match e {
            SubmitError::Invalid(e) => V1Error::invalid(e.field, e.message),
            SubmitError::QueueFull { .. } => {
                V1Error::new(StatusCode::TOO_MANY_REQUESTS, "queue_full", e.to_string())
            }
            SubmitError::ShuttingDown => V1Error::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                e.to_string(),
            ),
            SubmitError::Session(e) => e.into(),
        }
    }
}

impl From<SessionError> for V1Error {
    fn from(e: SessionError) -> V1Error {
        let text = e.to_string();
        match e {
            SessionError::Invalid(e) => V1Error::invalid(e.field, e.message),
            SessionError::Unknown { .. } => V1Error::not_found(text),
            SessionError::NoSuchFile { .. } => V1Error {
                field: Some("path".into()),
                ..V1Error::not_found(text)
            },
            SessionError::Full(_) => {
                V1Error::new(StatusCode::TOO_MANY_REQUESTS, "sessions_full", text)
            }
            SessionError::Unavailable(_) | SessionError::ShuttingDown => {
                V1Error::new(StatusCode::SERVICE_UNAVAILABLE, "engine_unavailable", text)
            }
            SessionError::Elsewhere { .. } | SessionError::Busy { .. } => {
                V1Error::new(StatusCode::CONFLICT, "conflict", text)
            }
            _ => V1Error::new(StatusCode::CONFLICT, "session_ended", text),
        }
    }
}

impl From<LookupError> for V1Error {
    fn from(e: LookupError) -> V1Error {
        match e {
            LookupError::Unknown { .. } | LookupError::Evicted { .. } => {
                V1Error::not_found(e.to_string())
            }
            LookupError::Elsewhere { .. } => {
                V1Error::new(StatusCode::CONFLICT, "conflict", e.to_string())
            }
        }
    }
}

impl IntoResponse for V1Error {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_string(),
                message: self.message,
                field: self.field,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        match self.status {
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
                headers.insert(header::RETRY_AFTER, RETRY_AFTER_SECONDS.into());
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                // The rest of the body was not read: the connection cannot be reused.
                headers.insert(
                    header::CONNECTION,
                    header::HeaderValue::from_static("close"),
                );
            }
            StatusCode::UNAUTHORIZED => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer realm=\"codebox\""),
                );
            }
            _ => {}
        }
        response
    }
}

/// The `/v1` routes, to be nested at `/v1`.
pub fn router(api: Api) -> Router {
    let document = super::openapi::document(api.manager());
    Router::new()
        .route("/runs", axum::routing::post(post_run))
        .route("/runs/{id}", get(get_run).delete(delete_run))
        .route("/languages", get(languages))
        .route("/history", get(history))
        .route(
            "/sessions",
            get(super::sessions::list).post(super::sessions::create),
        )
        .route(
            "/sessions/{id}",
            axum::routing::delete(super::sessions::close),
        )
        .route(
            "/sessions/{id}/files/{*path}",
            get(super::sessions::read_file),
        )
        .route("/sessions/{id}/files", get(super::sessions::list_files))
        .route("/sessions/{id}/files/", get(super::sessions::list_files))
        .route(
            "/openapi.json",
            get(move || {
                let document = document.clone();
                async move { Json(document) }
            }),
        )
        .fallback(|| async {
            V1Error::not_found("no such route; see GET /v1/openapi.json for the routes of /v1")
        })
        .method_not_allowed_fallback(|| async {
            V1Error::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method; see GET /v1/openapi.json",
            )
        })
        .with_state(api)
}

/// The arguments of `POST /v1/runs`: `run_code`'s, plus `wait`.
pub fn parse_run_body(bytes: &[u8]) -> Result<(RunRequest, bool), V1Error> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        V1Error::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            format!("the body is not JSON: {e}"),
        )
    })?;
    let serde_json::Value::Object(mut arguments) = value else {
        return Err(V1Error::new(
            StatusCode::BAD_REQUEST,
            "invalid_argument",
            "the body must be a JSON object of run_code's arguments (language, code, ...)",
        ));
    };
    let wait = match arguments.remove("wait") {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Bool(b)) => b,
        Some(_) => return Err(V1Error::invalid("wait", "must be true or false")),
    };
    let request = from_value(serde_json::Value::Object(arguments))?;
    Ok((request, wait))
}

async fn post_run(
    State(api): State<Api>,
    client: Client,
    body: Body,
) -> Result<Response, V1Error> {
    let bytes = read_body(body, api.max_body).await?;
    let (request, wait) = parse_run_body(&bytes)?;
    let m = api.manager();
    let accepted = match m.submit(request) {
        Ok(a) => a,
        Err(SubmitError::Session(e)) => return Err(m.explain(e).await.into()),
        Err(e) => return Err(e.into()),
    };
    if !wait {
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let report = run_to_end(m, &accepted.run_id, &client).await?;
    Ok(Json(report).into_response())
}

/// The query parameters of a request, refusing any not in `known`.
pub(super) fn query(raw: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, V1Error> {
    let pairs = query_pairs(raw);
    for (k, _) in &pairs {
        if !known.contains(&k.as_str()) {
            return Err(V1Error::invalid(
                k.clone(),
                format!(
                    "unknown query parameter; this route takes {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ),
            ));
        }
    }
    Ok(pairs)
}

/// The run id of the path, in either of its forms (a Judge0 token is one), or a clear refusal
/// (an id that is not UTF-8 once decoded).
fn run_id(path: Result<Path<String>, PathRejection>) -> Result<String, V1Error> {
    path.map(|Path(id)| ids::run_id(&id))
        .map_err(|e| V1Error::invalid("id", format!("not a run id: {e}")))
}

async fn get_run(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, V1Error> {
    let id = run_id(path)?;
    let mut wait = 0.0;
    for (_, v) in query(raw.as_deref(), &["wait_seconds"])? {
        wait = v
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|w| w.is_finite() && (0.0..=MAX_WAIT_SECONDS).contains(w))
            .ok_or_else(|| {
                V1Error::invalid(
                    "wait_seconds",
                    format!("must be a number from 0 to {MAX_WAIT_SECONDS:.0}; got `{v}`"),
                )
            })?;
    }
    let report = api
        .manager()
        .wait(&id, Duration::from_secs_f64(wait))
        .await?;
    Ok(Json(report).into_response())
}

async fn delete_run(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, V1Error> {
    let id = run_id(path)?;
    query(raw.as_deref(), &[])?;
    let report = api.manager().stop(&id).await?;
    Ok(Json(report).into_response())
}

async fn languages(State(api): State<Api>, RawQuery(raw): RawQuery) -> Result<Response, V1Error> {
    query(raw.as_deref(), &[])?;
    let m = api.manager();
    let c = catalog(m.executor().engine().as_ref(), m.registry(), m.config())
        .await
        .map_err(|e| {
            V1Error::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "engine_unavailable",
                format!("listing the languages failed: {e}"),
            )
        })?;
    Ok(Json(c).into_response())
}

async fn history(State(api): State<Api>, RawQuery(raw): RawQuery) -> Result<Response, V1Error> {
    let mut params = HistoryParams::default();
    for (k, v) in query(
        raw.as_deref(),
        &["limit", "status", "language", "session_id"],
    )? {
        match k.as_str() {
            "limit" => {
                params.limit = Some(v.trim().parse().map_err(|_| {
                    V1Error::invalid("limit", format!("must be a whole number; got `{v}`"))
                })?)
            }
            "status" => params.status = Some(v),
            "session_id" => params.session_id = Some(v),
            _ => params.language = Some(v),
        }
    }
    match query_history(api.manager(), params).await {
        Ok(h) => Ok(Json(h).into_response()),
        Err(HistoryQueryError::Invalid { field, message }) => Err(V1Error::invalid(field, message)),
        Err(e @ HistoryQueryError::Unavailable(_)) => Err(V1Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
            e.to_string(),
        )),
    }
}
