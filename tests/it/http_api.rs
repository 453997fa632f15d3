//! The APIs for programs (`/v1`, Piston's `/api/v2`, Judge0's routes) in-process, on the
//! fake engine: answers, refusals in each API's shape, the shared token, Host and Origin
//! checks, and the OpenAPI document's routes. The real clients run against the real binary
//! and Docker in `tests/api/` (`.ci/run`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use codebox::config::HttpSettings;
use codebox::engine::fake::{exited, FakeEngine};
use codebox::mcp::CodeboxServer;
use codebox::runs::RunManager;
use codebox::transport::http::{router, Token};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::mcp_support::fake_manager;

const TOKEN: &str = "api-token-0123456789abcdef";
const BODY_CAP: usize = 64 * 1024;

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    http: reqwest::Client,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn start(manager: RunManager, token: Option<&str>) -> Server {
    let policy = HttpSettings {
        max_body_bytes: BODY_CAP,
        ..HttpSettings::default()
    };
    let stop = CancellationToken::new();
    let app = router(
        CodeboxServer::new(manager),
        token.map(Token::new),
        &policy,
        stop.child_token(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ct = stop.clone();
    tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move { ct.cancelled().await })
            .await
    });
    Server {
        addr,
        stop,
        http: reqwest::Client::new(),
    }
}

impl Server {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let mut r = self
            .http
            .request(method.parse().unwrap(), self.url(path))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            r = r
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        let r = r.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }
}

fn fake_with_output() -> Arc<FakeEngine> {
    let fake = Arc::new(FakeEngine::new());
    fake.set_default(exited(0, "hi\n"));
    fake
}

/// `{error: {code, field}}` of a `/v1` refusal.
fn code_and_field(v: &Value) -> (String, Option<String>) {
    (
        v["error"]["code"].as_str().unwrap_or("").to_string(),
        v["error"]["field"].as_str().map(str::to_string),
    )
}

#[tokio::test]
async fn v1_runs_wait_or_answer_202_and_reports_are_read_and_stopped_by_id() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    let (status, report) = s
        .send(
            "POST",
            "/v1/runs",
            Some(r#"{"language": "js", "code": "x"}"#),
        )
        .await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["language"], "javascript");
    assert_eq!(report["stdout"], "hi\n");

    let (status, accepted) = s
        .send(
            "POST",
            "/v1/runs",
            Some(r#"{"language": "javascript", "code": "x", "wait": false}"#),
        )
        .await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().unwrap().to_string();
    assert!(matches!(
        accepted["status"].as_str(),
        Some("queued" | "running")
    ));
    let (status, polled) = s
        .send("GET", &format!("/v1/runs/{id}?wait_seconds=10"), None)
        .await;
    assert_eq!(
        (status, polled["status"].as_str()),
        (200, Some("succeeded"))
    );
    let (status, stopped) = s.send("DELETE", &format!("/v1/runs/{id}"), None).await;
    assert_eq!(status, 200);
    assert_eq!(
        stopped, polled,
        "stopping a finished run returns its report"
    );

    let (status, e) = s.send("GET", "/v1/runs/nope", None).await;
    assert_eq!((status, code_and_field(&e).0.as_str()), (404, "not_found"));
    let (status, langs) = s.send("GET", "/v1/languages", None).await;
    assert_eq!(status, 200);
    assert!(langs["languages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|l| l["language"] == "python"));
    let (status, e) = s.send("GET", "/v1/history?limit=5", None).await;
    assert_eq!(status, 503, "the fake manager keeps no history: {e}");
}

#[tokio::test]
async fn v1_refusals_name_the_field_and_have_their_status() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    for (body, field) in [
        (r#"{"code": "x"}"#, Some("language")),
        (r#"{"language": "python"}"#, Some("code")),
        (r#"{"language": "cobra", "code": "x"}"#, Some("language")),
        (
            r#"{"language": "python", "code": "x", "limits": {"memory_mb": 999999}}"#,
            Some("limits.memory_mb"),
        ),
        (
            r#"{"language": "python", "code": "x", "limits": {"memory_mb": "a lot"}}"#,
            Some("limits.memory_mb"),
        ),
        (
            r#"{"language": "python", "code": "x", "wait": "yes"}"#,
            Some("wait"),
        ),
        (
            r#"{"language": "python", "code": "x", "network": true}"#,
            Some("network"),
        ),
        (
            r#"{"language": "python", "code": "x", "files": [{"path": "../x", "content": ""}]}"#,
            Some("files[0].path"),
        ),
        ("[1, 2]", None),
        ("{", None),
    ] {
        let (status, e) = s.send("POST", "/v1/runs", Some(body)).await;
        assert_eq!(status, 400, "{body}: {e}");
        assert_eq!(
            code_and_field(&e),
            ("invalid_argument".to_string(), field.map(str::to_string)),
            "{body}"
        );
        assert!(!e["error"]["message"].as_str().unwrap().is_empty());
    }
    for path in [
        "/v1/runs/x?wait_seconds=61",
        "/v1/runs/x?wait_seconds=soon",
        "/v1/runs/x?follow=1",
        "/v1/history?limit=0",
        "/v1/history?status=done",
    ] {
        let (status, e) = s.send("GET", path, None).await;
        assert_eq!(status, 400, "{path}: {e}");
        assert!(code_and_field(&e).1.is_some(), "{path}: {e}");
    }
    let (status, e) = s.send("PUT", "/v1/runs", Some("{}")).await;
    assert_eq!(
        (status, code_and_field(&e).0.as_str()),
        (405, "method_not_allowed")
    );
    let (status, e) = s.send("GET", "/v1/nope", None).await;
    assert_eq!((status, code_and_field(&e).0.as_str()), (404, "not_found"));

    let big = json!({"language": "python", "code": "x".repeat(BODY_CAP + 1)}).to_string();
    let (status, e) = s.send("POST", "/v1/runs", Some(&big)).await;
    assert_eq!((status, code_and_field(&e).0.as_str()), (413, "too_large"));

    let r = s.http.get(s.url("/v1/languages")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.headers().contains_key("www-authenticate"));
    let e: Value = r.json().await.unwrap();
    assert_eq!(code_and_field(&e).0, "unauthorized");
    let r = s
        .http
        .get(s.url("/v1/languages"))
        .bearer_auth(TOKEN)
        .header("host", "evil.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a foreign Host is refused as at /mcp");
    let r = s
        .http
        .post(s.url("/api/v2/execute"))
        .bearer_auth(TOKEN)
        .header("origin", "http://evil.example.com")
        .header("content-type", "text/plain")
        .body(r#"{"language": "python", "version": "*", "files": [{"content": "x"}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a web page's request is refused");
}

#[tokio::test]
async fn v1_a_full_queue_is_429_with_retry_after() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| {
        c.runs.max_concurrent_runs = 1;
        c.runs.max_queued_runs = 1;
    });
    let s = start(m, Some(TOKEN)).await;
    let run = r#"{"language": "javascript", "code": "x", "wait": false}"#;
    for _ in 0..2 {
        assert_eq!(s.send("POST", "/v1/runs", Some(run)).await.0, 202);
    }
    let r = s
        .http
        .post(s.url("/v1/runs"))
        .bearer_auth(TOKEN)
        .body(run)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "5");
    let e: Value = r.json().await.unwrap();
    assert_eq!(code_and_field(&e).0, "queue_full");
}

#[tokio::test]
async fn every_route_of_the_openapi_document_answers_and_none_is_missing() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    let (status, doc) = s.send("GET", "/v1/openapi.json", None).await;
    assert_eq!(status, 200);
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let mut operations = Vec::new();
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            operations.push(format!("{} {path}", method.to_uppercase()));
            let concrete = path.replace("{id}", "nope");
            let body = (method == "post").then_some(r#"{"language": "js", "code": "x"}"#);
            let (status, _) = s.send(&method.to_uppercase(), &concrete, body).await;
            let documented: Vec<&String> = op["responses"].as_object().unwrap().keys().collect();
            assert!(
                documented.contains(&&status.to_string()),
                "{method} {path} answered {status}, documented {documented:?}"
            );
        }
    }
    operations.sort();
    assert_eq!(
        operations,
        [
            "DELETE /v1/runs/{id}",
            "GET /v1/history",
            "GET /v1/languages",
            "GET /v1/openapi.json",
            "GET /v1/runs/{id}",
            "POST /v1/runs",
        ]
    );
    for schema in [
        "RunBody",
        "RunReport",
        "Accepted",
        "Catalog",
        "HistoryResult",
        "ErrorBody",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "no schema {schema}"
        );
    }
    assert!(doc["components"]["schemas"]["RunBody"]["properties"]["wait"].is_object());
}

#[tokio::test]
async fn piston_runtimes_and_execute_answer_as_piston_with_text_plain_and_minus_one() {
    let fake = fake_with_output();
    let s = start(fake_manager(&fake, |_| {}), None).await;
    let runtimes: Vec<Value> = s
        .http
        .get(s.url("/api/v2/runtimes"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cpp = runtimes.iter().find(|r| r["language"] == "c++").unwrap();
    assert!(cpp["aliases"].as_array().unwrap().contains(&json!("cpp")));
    let js = runtimes
        .iter()
        .find(|r| r["language"] == "javascript")
        .unwrap();
    let version = js["version"].as_str().unwrap().to_string();
    assert_eq!(version.split('.').count(), 3, "{version}");

    // What piston-client 1.0.2 sends.
    let post = |body: Value| {
        s.http
            .post(s.url("/api/v2/execute"))
            .header("content-type", "text/plain;charset=UTF-8")
            .body(body.to_string())
            .send()
    };
    let r = post(
        json!({"language": "javascript", "version": version, "files": [{"content": "x"}],
        "stdin": "", "args": ["1", "2", "3"], "compile_timeout": 10000, "run_timeout": 3000,
        "compile_memory_limit": -1, "run_memory_limit": 104857600}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let out: Value = r.json().await.unwrap();
    assert_eq!(out["language"], "javascript");
    assert_eq!(out["run"]["stdout"], "hi\n");
    assert_eq!(out["run"]["output"], "hi\n");
    assert_eq!(out["run"]["code"], 0);
    assert_eq!(out["run"]["signal"], Value::Null);
    assert!(
        out.get("compile").is_none(),
        "javascript has no compile stage: {out}"
    );
    let run_spec = fake.specs().into_iter().last().unwrap();
    assert_eq!(
        run_spec.memory_bytes,
        100 * 1024 * 1024,
        "run_memory_limit in bytes"
    );
    assert!(run_spec.cmd.iter().any(|a| a == "3") || fake.payloads().len() > 0);

    // A client's compile limits may lower the operator's: the compile container gets it.
    let r = post(
        json!({"language": "c", "files": [{"content": "int main(){}"}],
        "compile_memory_limit": 300 * 1024 * 1024}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        fake.specs()
            .iter()
            .any(|spec| spec.memory_bytes == 300 * 1024 * 1024),
        "no container got the lowered compile memory"
    );

    for (body, wanted) in [
        (
            json!({"language": "cobra", "version": "*", "files": [{"content": "x"}]}),
            "cobra-* runtime is unknown",
        ),
        (
            json!({"language": "js", "version": "1.2.3", "files": [{"content": "x"}]}),
            "js-1.2.3 runtime is unknown",
        ),
        (
            json!({"language": "js", "files": [{"content": "x"}], "run_timeout": 99_999_999}),
            "run_timeout cannot exceed the configured limit of",
        ),
        (
            json!({"language": "js", "files": [{"content": "x"}], "run_memory_limit": 1e15}),
            "run_memory_limit cannot exceed the configured limit of",
        ),
        (
            json!({"language": "c", "files": [{"content": "x"}], "compile_timeout": 999_999}),
            "compile_timeout cannot exceed the configured limit of",
        ),
        (
            json!({"language": "js", "files": [{"content": "x"}], "run_timeout": -5}),
            "run_timeout must be non-negative",
        ),
        (
            json!({"language": "js", "files": []}),
            "files must include at least one",
        ),
        (
            json!({"language": "js", "files": [{"content": "x"}, {"name": "../x", "content": ""}]}),
            "files[1].name",
        ),
        (
            json!({"language": "js", "files": [{"content": "x"}], "run_memory_limit": 1024}),
            "run_memory_limit",
        ),
        (json!({"language": "js"}), "files"),
        (
            json!({"language": 5, "files": [{"content": "x"}]}),
            "language",
        ),
    ] {
        let r = post(body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let e: Value = r.json().await.unwrap();
        let message = e["message"].as_str().unwrap_or_default();
        assert!(message.contains(wanted), "{body}: {message}");
    }
    let r = s.http.get(s.url("/api/v2/packages")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["message"].is_string());
}

#[tokio::test]
async fn an_mcp_session_delete_answers_204() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let r = s
        .http
        .post(s.url("/mcp"))
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(init.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
    let r = s
        .http
        .delete(s.url("/mcp"))
        .bearer_auth(TOKEN)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .await
        .unwrap();
    // The MCP Python SDK logs "Session termination failed" for anything but 200 and 204.
    assert_eq!(r.status(), 204);
    tokio::time::sleep(Duration::from_millis(10)).await;
}
