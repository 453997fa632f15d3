//! A call forwarded to the server that holds its run or session: the same method, path, query
//! and body, with the cluster secret instead of the client's token; the owner's answer comes
//! back as it is (status, type, body, streamed).

use std::time::Duration;

use axum::http::{header, StatusCode};
use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub(super) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long connecting to another server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Headers of the client's request passed on to the owner (`Last-Event-ID`: a resumed event
/// stream goes on where the client left off, SPEC section 14).
pub(super) const PASSED: [header::HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::ACCEPT,
    header::HeaderName::from_static("last-event-id"),
];

pub(super) fn client() -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(30))
        .build(http)
}

/// Why a call could not be forwarded.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the codebox server holding it (instance {instance} at {url}) does not answer: {detail}; try again in a few seconds (once its lease of {lease_seconds} s lapses, another server takes over what it held)")]
    Unreachable {
        instance: String,
        url: String,
        detail: String,
        lease_seconds: u64,
    },
    #[error("the codebox server holding it (instance {instance} at {url}) did not answer within {seconds:.0} s; try again")]
    TimedOut {
        instance: String,
        url: String,
        seconds: f64,
    },
}

/// The owner's answer to a forwarded call, read whole (for answers turned into MCP results).
#[derive(Debug)]
pub struct Forwarded {
    pub status: StatusCode,
    pub body: serde_json::Value,
}

/// An error and its causes, one sentence (hyper's client errors say little at the top).
pub(super) fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
