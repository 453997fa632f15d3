//! `/v1/sessions`: sessions over plain HTTP (SPEC section 11), as the MCP tools serve them:
//! - `POST /v1/sessions`: `create_session`'s arguments; `200` with the session;
//! - `GET /v1/sessions`: `list_sessions`; `DELETE /v1/sessions/{id}`: `close_session`;
//! - `GET /v1/sessions/{id}/files/{path}[?offset=N&max_bytes=N]`: `read_session_file`, the
//!   bytes in `content_base64`; `GET /v1/sessions/{id}/files` (or `.../files/`) lists the
//!   working directory.
//!
//! Executions go through `POST /v1/runs` with `session_id`. An ended session is `409
//! session_ended`, an unknown one `404`, a full server `429 sessions_full` with `Retry-After`,
//! `packages` that do not install `400 invalid_argument` naming `packages`.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::error::{query, V1Error};
use crate::api::{from_value, read_body, Api};
use crate::contract::SessionError;
use crate::contract::SessionRequest;

/// A session error, told better where the history knows more.
async fn refused(api: &Api, e: SessionError) -> V1Error {
    api.sessions().explain(e).await.into()
}

pub async fn create(State(api): State<Api>, body: Body) -> Result<Response, V1Error> {
    let bytes = read_body(body, api.max_body).await?;
    let value: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| V1Error::invalid("body", format!("the body is not JSON: {e}")))?;
    let request: SessionRequest = from_value(value)?;
    match api.sessions().create(request).await {
        Ok(info) => Ok(Json(info).into_response()),
        Err(e) => Err(refused(&api, e).await),
    }
}

pub async fn list(State(api): State<Api>, RawQuery(raw): RawQuery) -> Result<Response, V1Error> {
    query(raw.as_deref(), &[])?;
    Ok(Json(api.sessions().list()).into_response())
}

fn session_id(path: Result<Path<String>, PathRejection>) -> Result<String, V1Error> {
    path.map(|Path(id)| id)
        .map_err(|e| V1Error::invalid("id", format!("not a session id: {e}")))
}

pub async fn close(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, V1Error> {
    let id = session_id(path)?;
    query(raw.as_deref(), &[])?;
    match api.sessions().close_removed(&id).await {
        Ok(closed) => Ok(Json(closed).into_response()),
        Err(e) => Err(refused(&api, e).await),
    }
}

pub(super) async fn read_file(
    State(api): State<Api>,
    path: Result<Path<(String, String)>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, V1Error> {
    let Path((id, file)) =
        path.map_err(|e| V1Error::invalid("path", format!("not a session file path: {e}")))?;
    read(&api, id, &file, raw.as_deref()).await
}

/// `GET /v1/sessions/{id}/files` and `.../files/`: the working directory's listing (clients
/// drop the `.` of `.../files/.`).
pub(super) async fn list_files(
    State(api): State<Api>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, V1Error> {
    let id = session_id(path)?;
    read(&api, id, ".", raw.as_deref()).await
}

async fn read(api: &Api, id: String, file: &str, raw: Option<&str>) -> Result<Response, V1Error> {
    let (mut offset, mut max_bytes) = (0u64, None);
    for (k, v) in query(raw, &["offset", "max_bytes"])? {
        let n: u64 = v.trim().parse().map_err(|_| {
            V1Error::invalid(k.clone(), format!("must be a whole number; got `{v}`"))
        })?;
        if k == "offset" {
            offset = n;
        } else {
            max_bytes = Some(n);
        }
    }
    match api.sessions().read(&id, file, offset, max_bytes).await {
        // The bytes read travel in `content_base64`.
        Ok(f) => Ok(Json(f.answer(false)).into_response()),
        Err(e) => Err(refused(api, e).await),
    }
}
