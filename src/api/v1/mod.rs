//! `/v1`: codebox's own JSON API. The same arguments, reports and errors as the MCP tools,
//! over plain HTTP:
//! - `POST /v1/runs`: `run_code`'s arguments; waits and answers the report (200), or with
//!   `"wait": false` answers `202 {run_id, status, limits}` at once;
//! - `GET /v1/runs/{id}[?wait_seconds=N]`: `get_result`; `DELETE /v1/runs/{id}`: `stop_run`;
//! - `GET /v1/runs/{id}/events`: the run's live events ([`events`]);
//! - `GET /v1/languages`, `GET /v1/history`, `GET /v1/openapi.json`;
//! - `/v1/sessions...`: see [`sessions`].
//!
//! An accepted request answers 200 with its report whatever the report's status. Refusals
//! are `{error: {code, message, field?}}` with the status of [`V1Error`].

use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

mod error;
pub mod events;
pub mod openapi;
pub mod sessions;

pub use error::{query, ErrorBody, ErrorDetail, V1Error, RETRY_AFTER_SECONDS};

use crate::api::{from_value, read_body, run_to_end, Api, Client};
use crate::catalog::catalog;
use crate::contract::ids;
use crate::contract::params::{HistoryParams, MAX_WAIT_SECONDS};
use crate::contract::RunRequest;
use crate::history::{HistoryResult, Query};
use crate::runs::SubmitError;

/// The `/v1` routes, to be nested at `/v1`.
pub fn router(api: Api) -> Router {
    let document = openapi::document(api.manager());
    Router::new()
        .route("/runs", axum::routing::post(post_run))
        .route("/runs/{id}", get(get_run).delete(delete_run))
        .route("/runs/{id}/events", get(events::run_events))
        .route("/languages", get(languages))
        .route("/history", get(history))
        .route("/sessions", get(sessions::list).post(sessions::create))
        .route("/sessions/{id}", axum::routing::delete(sessions::close))
        .route("/sessions/{id}/files/{*path}", get(sessions::read_file))
        .route("/sessions/{id}/files", get(sessions::list_files))
        .route("/sessions/{id}/files/", get(sessions::list_files))
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
fn parse_run_body(bytes: &[u8]) -> Result<(RunRequest, bool), V1Error> {
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

async fn post_run(State(api): State<Api>, client: Client, body: Body) -> Result<Response, V1Error> {
    let bytes = read_body(body, api.max_body).await?;
    let (request, wait) = parse_run_body(&bytes)?;
    let m = api.manager();
    let accepted = match api.sessions().submit(request) {
        Ok(a) => a,
        Err(SubmitError::Session(e)) => return Err(api.sessions().explain(e).await.into()),
        Err(e) => return Err(e.into()),
    };
    if !wait {
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let report = run_to_end(m, &accepted.run_id, &client).await?;
    Ok(Json(report).into_response())
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
    let m = api.manager();
    let f = params
        .check(m.registry())
        .map_err(|e| V1Error::invalid(e.field, e.message))?;
    let unavailable = |why: String| {
        V1Error::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
            format!("history: {why}"),
        )
    };
    let Some(history) = m.history() else {
        return Err(unavailable("this server keeps no history".into()));
    };
    let runs = history
        .query(Query::from(f))
        .await
        .map_err(|e| unavailable(e.to_string()))?;
    Ok(Json(HistoryResult { runs }).into_response())
}
