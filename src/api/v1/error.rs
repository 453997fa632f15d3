//! The refusals of `/v1`: `{error: {code, message, field?}}` with the status of [`V1Error`],
//! and the check that a route is given only the query parameters it takes.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use crate::api::{query_pairs, BodyError};
use crate::contract::SessionError;
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

/// The query parameters of a request, refusing any not in `known`.
pub fn query(raw: Option<&str>, known: &[&str]) -> Result<Vec<(String, String)>, V1Error> {
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
