//! Judge0 CE 1.13.1 compatible routes.

use std::time::Duration;

/// The Judge0 fields of submissions, kept beside their runs.
pub struct Store {
    retention: Duration,
}

impl Store {
    pub fn new(retention: Duration) -> Store {
        Store { retention }
    }
}

/// A refusal in Judge0's shape: `{error}`.
pub fn refusal(status: axum::http::StatusCode, message: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    (status, axum::Json(serde_json::json!({ "error": message }))).into_response()
}

pub fn router(_api: super::Api) -> axum::Router {
    axum::Router::new()
}
