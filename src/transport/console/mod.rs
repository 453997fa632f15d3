//! The console at `/`: a page for people, served from the binary (its HTML, script and style
//! are compiled in; nothing is fetched from elsewhere, so it works offline). The page itself
//! holds no data: it asks the same routes as any program (`/v1`, `/metrics`, `/healthz`) with
//! the token the person types, kept in the page's memory and sent as a bearer header (never a
//! cookie, never in a URL). Its answers carry a strict Content-Security-Policy: its own
//! script and style only, no inline script, images from `data:` (returned plots), requests
//! to its own origin only, no framing. `http.console = false` (`--no-console`) removes it.

use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;

use crate::runs::RunManager;

const INDEX: &str = include_str!("index.html");
const SCRIPT: &str = include_str!("console.js");
const STYLE: &str = include_str!("console.css");

/// The console's policy: nothing but its own script and style; images it makes from data.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut r = ([(header::CONTENT_TYPE, kind)], body).into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// The page and its assets (no token needed: they hold no data).
pub fn pages() -> Router {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX) }),
        )
        .route(
            "/console/console.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/console/console.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
}

/// Each language's first sample program (the playground preloads it), behind the token.
pub fn samples(manager: RunManager) -> Router {
    Router::new()
        .route("/console/samples.json", get(sample_programs))
        .with_state(manager)
}

async fn sample_programs(State(m): State<RunManager>) -> Response {
    let mut out = serde_json::Map::new();
    for (id, l) in &m.registry().languages {
        if let Some(s) = l.tests.first() {
            out.insert(
                id.clone(),
                json!({"code": s.code, "stdin": s.stdin.clone().unwrap_or_default()}),
            );
        }
    }
    Json(out).into_response()
}
