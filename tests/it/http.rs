//! The Streamable HTTP transport in-process (axum on 127.0.0.1, port 0): bearer token, Host
//! check, body cap, `/healthz`, `/metrics`, the start-up rules for authentication, and what
//! the protocol fuzzer found: invalid messages and ids reused in flight get JSON-RPC errors
//! with their ids.

use std::net::SocketAddr;
use std::sync::Arc;

use codebox::config::HttpSettings;
use codebox::engine::fake::FakeEngine;
use codebox::mcp::{ClusterServer, CodeboxServer};
use codebox::runs::RunManager;
use codebox::sessions::Sessions;
use codebox::transport::http::{resolve_auth, router, serve_connections, Token};
use codebox::transport::ServeError;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::mcp_support::{fake_manager, params};

const TOKEN: &str = "test-token-0123456789abcdef";
pub const BODY_CAP: usize = 64 * 1024;

/// The HTTP application on 127.0.0.1, port 0, served as `codebox serve` serves it; stopped
/// when dropped.
pub struct Server {
    pub addr: SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Begin the shutdown and wait up to `limit` for the server to end; whether it did.
    pub async fn stop_within(&mut self, limit: std::time::Duration) -> bool {
        self.stop.cancel();
        tokio::time::timeout(limit, &mut self.served).await.is_ok()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub async fn start(manager: RunManager, token: Option<&str>) -> Server {
    start_with(manager, token, |_| {}).await
}

/// [`start`] with its HTTP settings changed by `tweak`.
pub async fn start_with(
    manager: RunManager,
    token: Option<&str>,
    tweak: impl FnOnce(&mut HttpSettings),
) -> Server {
    start_sessions(Sessions::new(manager), token, tweak).await
}

/// [`start_with`] for these sessions (and their runs).
pub async fn start_sessions(
    sessions: Arc<Sessions>,
    token: Option<&str>,
    tweak: impl FnOnce(&mut HttpSettings),
) -> Server {
    let mut policy = HttpSettings {
        max_body_bytes: BODY_CAP,
        ..HttpSettings::default()
    };
    tweak(&mut policy);
    let stop = CancellationToken::new();
    let app = router(
        ClusterServer::new(CodeboxServer::new(sessions), None),
        token.map(Token::new),
        &policy,
        stop.child_token(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ct = stop.clone();
    let served = tokio::spawn(serve_connections(listener, app, async move {
        ct.cancelled().await
    }));
    Server { addr, stop, served }
}

fn initialize() -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}})
}

async fn post(
    addr: SocketAddr,
    auth: Option<&str>,
    host: Option<&str>,
    body: String,
) -> reqwest::Response {
    let mut req = reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body);
    if let Some(a) = auth {
        req = req.header("authorization", a);
    }
    if let Some(h) = host {
        req = req.header("host", h);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn mcp_over_http_requires_the_bearer_token() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let body = initialize().to_string();
    let r = post(s.addr, None, None, body.clone()).await;
    assert_eq!(r.status(), 401);
    assert!(r.headers().get("www-authenticate").is_some());
    for wrong in [
        "Bearer nope",
        &format!("Basic {TOKEN}"),
        &format!("Bearer {TOKEN}x"),
        "Bearer",
    ] {
        assert_eq!(
            post(s.addr, Some(wrong), None, body.clone()).await.status(),
            401,
            "{wrong}"
        );
    }
    assert_eq!(
        post(s.addr, Some(&format!("Bearer {TOKEN}")), None, body)
            .await
            .status(),
        200
    );

    // A real MCP client with the token gets the tools and runs code.
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", s.addr))
            .auth_header(TOKEN),
    );
    let client = ().serve(transport).await.expect("client with token connects");
    assert_eq!(client.list_all_tools().await.unwrap().len(), 10);
    let res = client
        .call_tool(params(
            "run_code",
            json!({"language": "python", "code": "print(1)"}),
        ))
        .await
        .unwrap();
    assert_eq!(res.structured_content.unwrap()["status"], "succeeded");
    // Without it, the client cannot even initialize.
    let transport = StreamableHttpClientTransport::from_uri(format!("http://{}/mcp", s.addr));
    assert!(().serve(transport).await.is_err());
}

#[tokio::test]
async fn a_wrong_host_header_is_refused_with_403() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let auth = format!("Bearer {TOKEN}");
    let r = post(
        s.addr,
        Some(&auth),
        Some("evil.example.com"),
        initialize().to_string(),
    )
    .await;
    assert_eq!(r.status(), 403);
    let r = post(
        s.addr,
        Some(&auth),
        Some(&format!("localhost:{}", s.addr.port())),
        initialize().to_string(),
    )
    .await;
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let mut big = initialize();
    big["params"]["padding"] = json!("x".repeat(BODY_CAP + 1));
    let r = post(
        s.addr,
        Some(&format!("Bearer {TOKEN}")),
        None,
        big.to_string(),
    )
    .await;
    assert_eq!(r.status(), 413);
    // The body was not read: the connection is not reused.
    assert_eq!(r.headers()["connection"], "close");
}

#[tokio::test]
async fn healthz_needs_no_token_and_metrics_do() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |_| {});
    let id = m.submit(codebox::contract::RunRequest {
        language: "python".into(),
        code: "print(1)".into(),
        ..Default::default()
    });
    m.wait(&id.unwrap().run_id, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let s = start(m, Some(TOKEN)).await;
    let http = reqwest::Client::new();
    let h = http
        .get(format!("http://{}/healthz", s.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(h.status(), 200);
    assert_eq!(h.json::<serde_json::Value>().await.unwrap()["status"], "ok");
    let unauth = http
        .get(format!("http://{}/metrics", s.addr))
        .send()
        .await
        .unwrap();
    assert_eq!(unauth.status(), 401);
    let m = http
        .get(format!("http://{}/metrics", s.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(m.status(), 200);
    let text = m.text().await.unwrap();
    for needle in [
        "codebox_runs_total{status=\"succeeded\",language=\"python\"} 1",
        "codebox_queue_depth 0",
        "codebox_active_runs 0",
        "codebox_run_latency_seconds_bucket{le=\"+Inf\"} 1",
        "codebox_run_latency_seconds_count 1",
        "codebox_containers_reaped_total 0",
        "# TYPE codebox_run_latency_seconds histogram",
    ] {
        assert!(text.contains(needle), "metrics lack `{needle}`:\n{text}");
    }
}

#[test]
fn http_refuses_to_start_without_a_token_unless_no_auth_on_loopback() {
    let on = |listen: &str| HttpSettings {
        listen: listen.into(),
        ..HttpSettings::default()
    };
    assert!(matches!(
        resolve_auth(&on("127.0.0.1:0"), None, None, false),
        Err(ServeError::NoToken)
    ));
    assert!(matches!(
        resolve_auth(&on("0.0.0.0:8765"), None, None, false),
        Err(ServeError::NoToken)
    ));
    assert!(matches!(
        resolve_auth(&on("0.0.0.0:8765"), None, None, true),
        Err(ServeError::NoAuthOnPublicAddress(_))
    ));
    assert!(matches!(
        resolve_auth(&on("127.0.0.1:0"), None, None, true),
        Ok(None)
    ));
    assert!(matches!(
        resolve_auth(&on("[::1]:0"), None, None, true),
        Ok(None)
    ));
    assert!(
        resolve_auth(&on("127.0.0.1:0"), None, Some(TOKEN.into()), true).is_err(),
        "--no-auth with a token is ambiguous"
    );
    assert!(matches!(
        resolve_auth(&on("0.0.0.0:8765"), None, Some(TOKEN.into()), false),
        Ok(Some(_))
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, format!("{TOKEN}\n")).unwrap();
    let mut c = on("0.0.0.0:8765");
    c.token_file = Some(file.clone());
    let token = resolve_auth(&c, None, None, false).unwrap().unwrap();
    let header = reqwest::header::HeaderValue::from_str(&format!("Bearer {TOKEN}")).unwrap();
    assert!(
        token.accepts(Some(&header)),
        "the file's trailing newline is trimmed"
    );
    c.token_file = Some(dir.path().join("missing"));
    assert!(matches!(
        resolve_auth(&c, None, None, false),
        Err(ServeError::TokenFile { .. })
    ));
    // The --token-file flag beats CODEBOX_TOKEN, which beats the setting.
    assert!(
        resolve_auth(&c, None, Some(TOKEN.into()), false).is_ok(),
        "CODEBOX_TOKEN beats a token_file setting that does not exist"
    );
    let other = resolve_auth(&c, Some(&file), Some("another-token-value".into()), false)
        .unwrap()
        .unwrap();
    assert!(other.accepts(Some(&header)), "the flag's file wins");
}

/// Open an MCP session with the raw client; returns its id.
async fn open_session(addr: SocketAddr) -> String {
    let auth = format!("Bearer {TOKEN}");
    let r = post(addr, Some(&auth), None, initialize().to_string()).await;
    assert_eq!(r.status(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let r = post_in(
        addr,
        &session,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}).to_string(),
    )
    .await;
    assert_eq!(r.status(), 202);
    session
}

async fn post_in(addr: SocketAddr, session: &str, body: String) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("http://{addr}/mcp"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", session)
        .header("mcp-protocol-version", "2025-06-18")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The JSON-RPC messages of an SSE or JSON response.
async fn messages(r: reqwest::Response) -> Vec<serde_json::Value> {
    let sse = r
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream"));
    let text = r.text().await.unwrap();
    if sse {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    } else {
        match serde_json::from_str(&text).unwrap() {
            serde_json::Value::Array(items) => items,
            v => vec![v],
        }
    }
}

#[tokio::test]
async fn an_invalid_message_over_http_gets_a_jsonrpc_error_with_its_id() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let session = open_session(s.addr).await;
    let r = post_in(
        s.addr,
        &session,
        json!({"jsonrpc": "2.0", "id": "bad", "method": "tools/call", "params": "x"}).to_string(),
    )
    .await;
    assert_eq!(r.status(), 400);
    let m = messages(r).await;
    assert_eq!(
        (m[0]["id"].clone(), m[0]["error"]["code"].clone()),
        (json!("bad"), json!(-32600))
    );
    let r = post_in(
        s.addr,
        &session,
        json!([{"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 2, "method": "ping"}]).to_string(),
    )
    .await;
    assert_eq!(r.status(), 400);
    let ids: Vec<serde_json::Value> = messages(r).await.iter().map(|m| m["id"].clone()).collect();
    assert_eq!(
        ids,
        [json!(1), json!(2)],
        "one error per request of a batch, in an array"
    );
    let r = post_in(s.addr, &session, "{\"jsonrpc\":".to_string()).await;
    assert_eq!(r.status(), 400);
    assert_eq!(messages(r).await[0]["error"]["code"], -32700);
    // A wrong content type is still rmcp's 415.
    let r = reqwest::Client::new()
        .post(format!("http://{}/mcp", s.addr))
        .bearer_auth(TOKEN)
        .header("content-type", "text/plain")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &session)
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 415);
}

#[tokio::test]
async fn a_request_reusing_an_id_in_flight_over_http_is_refused_and_the_first_keeps_its_answer() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let session = open_session(s.addr).await;
    let started = post_in(
        s.addr,
        &session,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "start_run", "arguments": {"language": "python", "code": "print(1)"}}})
        .to_string(),
    )
    .await;
    let run_id = messages(started).await[0]["result"]["structuredContent"]["run_id"].clone();
    let poll = post_in(
        s.addr,
        &session,
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "get_result", "arguments": {"run_id": run_id, "wait_seconds": 2}}})
        .to_string(),
    );
    let duplicate = async {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        post_in(
            s.addr,
            &session,
            json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}).to_string(),
        )
        .await
    };
    let (poll, duplicate) = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        futures_util::future::join(async { messages(poll.await).await }, duplicate),
    )
    .await
    .expect("both answered");
    assert_eq!(duplicate.status(), 400);
    let refused = messages(duplicate).await;
    assert_eq!(refused[0]["id"], 7);
    assert!(refused[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("already used"));
    let answer = poll
        .iter()
        .find(|m| m["id"] == 7)
        .expect("the first keeps its answer");
    assert_eq!(answer["result"]["structuredContent"]["status"], "running");
    // Answered, the id is free again.
    let r = post_in(
        s.addr,
        &session,
        json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}).to_string(),
    )
    .await;
    assert_eq!(r.status(), 200);
    assert_eq!(messages(r).await[0]["result"], json!({}));
}

/// A connection still open when shutdown begins (here a run's event stream, whose run is
/// stuck) does not keep the server from exiting: the open connections have a grace to
/// finish, then are cut. (A server in the cluster tests, asked to stop, was seen still
/// running 90 s later.)
#[tokio::test]
async fn an_open_connection_does_not_hold_the_shutdown() {
    use codebox::engine::fake::Step;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = Arc::new(FakeEngine::new());
    fake.delay(Step::CreateContainer, std::time::Duration::from_secs(3000));
    let m = fake_manager(&fake, |_| {});
    let run = m
        .submit(codebox::contract::RunRequest {
            language: "python".into(),
            code: "print(1)".into(),
            limits: Some(codebox::contract::LimitsInput {
                timeout_seconds: Some(3000.0),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
    let mut server = start_with(m, Some(TOKEN), |p| *p = HttpSettings::default()).await;
    let addr = server.addr;
    let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "GET /v1/runs/{}/events HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n",
        run.run_id
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\r\n\r\n") {
        let n = c.read(&mut buf).await.unwrap();
        assert!(n > 0, "the server closed the connection: {seen:?}");
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(
        String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&seen)
    );
    assert!(
        server.stop_within(std::time::Duration::from_secs(60)).await,
        "the server still serves 60 s after shutdown began"
    );
    drop(c);
}
