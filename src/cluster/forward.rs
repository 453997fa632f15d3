//! A call forwarded to the server that holds its run or session: the same method, path, query
//! and body, with the cluster secret instead of the client's token; the owner's answer comes
//! back as it is (status, type, body, streamed).

use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Cluster, Peer, FORWARDED_BY_HEADER, SECRET_HEADER};

pub(super) type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// How long connecting to another server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Headers of the client's request passed on to the owner (`Last-Event-ID`: a resumed event
/// stream goes on where the client left off, SPEC section 14).
const PASSED: [header::HeaderName; 3] = [
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

impl Cluster {
    /// Send `method path_and_query` with `body` (and the headers of `PASSED` from
    /// `headers`) to `peer`, within `timeout` if given; the answer as it comes.
    pub async fn send(
        &self,
        peer: &Peer,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        timeout: Option<Duration>,
    ) -> Result<Response, ForwardError> {
        let unreachable = |detail: String| ForwardError::Unreachable {
            instance: peer.instance.clone(),
            url: peer.url.clone(),
            detail,
            lease_seconds: self.lease.as_secs(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", peer.url));
        for name in PASSED {
            if let Some(v) = headers.get(&name) {
                request = request.header(name, v.clone());
            }
        }
        let request = request
            .header(
                SECRET_HEADER,
                HeaderValue::from_str(&self.secret).map_err(|e| unreachable(e.to_string()))?,
            )
            .header(FORWARDED_BY_HEADER, self.instance.as_str())
            .body(Full::new(body))
            .map_err(|e| unreachable(format!("cannot build the request: {e}")))?;
        let sent = self.client.request(request);
        let answer = match timeout {
            None => sent.await,
            Some(t) => match tokio::time::timeout(t, sent).await {
                Ok(a) => a,
                Err(_) => {
                    return Err(ForwardError::TimedOut {
                        instance: peer.instance.clone(),
                        url: peer.url.clone(),
                        seconds: t.as_secs_f64(),
                    })
                }
            },
        };
        let answer = answer.map_err(|e| {
            self.forget_owner(peer);
            unreachable(with_causes(&e))
        })?;
        Ok(answer.map(Body::new))
    }

    /// [`Cluster::send`] of a JSON body (or none), the JSON answer read whole.
    pub async fn call_json(
        &self,
        peer: &Peer,
        method: Method,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
        timeout: Option<Duration>,
    ) -> Result<Forwarded, ForwardError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let bytes = match body {
            Some(v) => {
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Bytes::from(serde_json::to_vec(v).unwrap_or_default())
            }
            None => Bytes::new(),
        };
        let read = async {
            let response = self
                .send(peer, method, path_and_query, &headers, bytes, None)
                .await?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| ForwardError::Unreachable {
                    instance: peer.instance.clone(),
                    url: peer.url.clone(),
                    detail: format!("its answer broke off: {e}"),
                    lease_seconds: self.lease.as_secs(),
                })?
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                serde_json::json!({"error": {"code": "bad_gateway", "message": String::from_utf8_lossy(&bytes)}})
            });
            Ok(Forwarded { status, body })
        };
        match timeout {
            None => read.await,
            Some(t) => tokio::time::timeout(t, read).await.unwrap_or_else(|_| {
                Err(ForwardError::TimedOut {
                    instance: peer.instance.clone(),
                    url: peer.url.clone(),
                    seconds: t.as_secs_f64(),
                })
            }),
        }
    }
}

/// An error and its causes, one sentence (hyper's client errors say little at the top).
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
