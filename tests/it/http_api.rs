//! The APIs for programs (`/v1`, Piston's `/api/v2`, Judge0's routes) in-process, on the
//! fake engine: answers, refusals in each API's shape, the shared token, Host and Origin
//! checks, and the OpenAPI document's routes. The real clients run against the real binary
//! and Docker in `tests/api/` (`.ci/run`).

use std::sync::Arc;
use std::time::Duration;

use codebox::engine::fake::{exited, FakeEngine};
use codebox::runs::RunManager;
use serde_json::{json, Value};

use crate::http::BODY_CAP;
use crate::mcp_support::fake_manager;

pub const TOKEN: &str = "api-token-0123456789abcdef";

/// The whole HTTP application (`crate::http::start`) with a client.
pub struct Server {
    app: crate::http::Server,
    http: reqwest::Client,
}

pub async fn start(manager: RunManager, token: Option<&str>) -> Server {
    Server {
        app: crate::http::start(manager, token).await,
        http: reqwest::Client::new(),
    }
}

/// [`start`] for these sessions (and their runs).
pub async fn start_sessions(
    sessions: std::sync::Arc<codebox::sessions::Sessions>,
    token: Option<&str>,
) -> Server {
    Server {
        app: crate::http::start_sessions(sessions, token, |_| {}).await,
        http: reqwest::Client::new(),
    }
}

impl Server {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.app.addr)
    }

    pub async fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
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
pub fn code_and_field(v: &Value) -> (String, Option<String>) {
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

/// A run id as a hyphenated UUID, the form a Judge0 token has.
fn hyphenated(run_id: &str) -> String {
    uuid::Uuid::parse_str(run_id)
        .unwrap()
        .hyphenated()
        .to_string()
}

#[tokio::test]
async fn a_run_is_named_by_its_judge0_token_over_v1() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    let body = r#"{"language": "javascript", "code": "x", "wait": false}"#;
    let (status, accepted) = s.send("POST", "/v1/runs", Some(body)).await;
    assert_eq!(status, 202, "{accepted}");
    let id = accepted["run_id"].as_str().unwrap().to_string();
    let token = hyphenated(&id);
    assert_ne!(token, id);
    for token in [token.clone(), token.to_uppercase()] {
        let (status, polled) = s
            .send("GET", &format!("/v1/runs/{token}?wait_seconds=10"), None)
            .await;
        assert_eq!(status, 200, "GET /v1/runs/{token}: {polled}");
        assert_eq!(polled["run_id"], id.as_str());
    }
    let (status, stopped) = s.send("DELETE", &format!("/v1/runs/{token}"), None).await;
    assert_eq!(status, 200, "DELETE /v1/runs/{token}: {stopped}");
    assert_eq!(stopped["run_id"], id.as_str());
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
async fn v1_sessions_open_run_read_list_close_and_tell_what_ended() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let (status, session) = s
        .send("POST", "/v1/sessions", Some(r#"{"language": "python"}"#))
        .await;
    assert_eq!(status, 200, "{session}");
    let id = session["session_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("cbx_"), "{id}");
    assert_eq!(session["stateful"], true);
    fake.script(codebox::engine::fake::Behaviour::Result("2".into()));
    let body = json!({"session_id": id, "code": "1 + 1"}).to_string();
    let (status, report) = s.send("POST", "/v1/runs", Some(&body)).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["result"], "2");
    assert_eq!(report["session"]["execution_count"], 1);
    assert_eq!(report["session"]["state"], "new");
    let (status, file) = s
        .send("GET", &format!("/v1/sessions/{id}/files/data.txt"), None)
        .await;
    assert_eq!(status, 200, "{file}");
    assert_eq!(
        file["content_base64"], "ZmFrZQ==",
        "the bytes travel in /v1"
    );
    assert_eq!(file["size_bytes"], 4);
    let (status, list) = s.send("GET", "/v1/sessions", None).await;
    assert_eq!(status, 200);
    assert_eq!(list["sessions"][0]["session_id"], id.as_str());
    assert_eq!(list["sessions"][0]["executions"], 1);
    let (status, closed) = s.send("DELETE", &format!("/v1/sessions/{id}"), None).await;
    assert_eq!((status, closed["closed"].clone()), (200, json!(true)));
    let (status, e) = s.send("POST", "/v1/runs", Some(&body)).await;
    assert_eq!(status, 409, "{e}");
    assert_eq!(code_and_field(&e).0, "session_ended");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("was closed"),
        "{e}"
    );
    let (status, e) = s.send("DELETE", "/v1/sessions/cbx_nope", None).await;
    assert_eq!((status, code_and_field(&e).0.as_str()), (404, "not_found"));
    let bad = json!({"session_id": "cbx_nope", "code": "1", "limits": {"memory_mb": 64}});
    let (status, e) = s.send("POST", "/v1/runs", Some(&bad.to_string())).await;
    assert_eq!(status, 404, "the session is looked up first: {e}");
}

#[tokio::test]
async fn v1_a_full_server_refuses_a_session_with_429_and_retry_after() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| c.sessions.max_sessions = 1);
    let s = start(m, Some(TOKEN)).await;
    let open = r#"{"language": "bash"}"#;
    assert_eq!(s.send("POST", "/v1/sessions", Some(open)).await.0, 200);
    let r = s
        .http
        .post(s.url("/v1/sessions"))
        .bearer_auth(TOKEN)
        .body(open)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "5");
    let e: Value = r.json().await.unwrap();
    assert_eq!(code_and_field(&e).0, "sessions_full");
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
            let concrete = path.replace("{id}", "nope").replace("{path}", "x");
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
            "DELETE /v1/sessions/{id}",
            "GET /v1/history",
            "GET /v1/languages",
            "GET /v1/openapi.json",
            "GET /v1/runs/{id}",
            "GET /v1/runs/{id}/events",
            "GET /v1/sessions",
            "GET /v1/sessions/{id}/files",
            "GET /v1/sessions/{id}/files/{path}",
            "POST /v1/runs",
            "POST /v1/sessions",
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

/// Every field of Judge0's configuration (`Config` of the official Python SDK 0.0.8).
const JUDGE0_CONFIG_FIELDS: [&str; 39] = [
    "allow_enable_network",
    "allow_enable_per_process_and_thread_memory_limit",
    "allow_enable_per_process_and_thread_time_limit",
    "allowed_languages_for_compile_options",
    "callbacks_max_tries",
    "callbacks_timeout",
    "cpu_extra_time",
    "cpu_time_limit",
    "enable_additional_files",
    "enable_batched_submissions",
    "enable_callbacks",
    "enable_command_line_arguments",
    "enable_compiler_options",
    "enable_network",
    "enable_per_process_and_thread_memory_limit",
    "enable_per_process_and_thread_time_limit",
    "enable_submission_delete",
    "enable_wait_result",
    "maintenance_mode",
    "max_cpu_extra_time",
    "max_cpu_time_limit",
    "max_extract_size",
    "max_file_size",
    "max_max_file_size",
    "max_max_processes_and_or_threads",
    "max_memory_limit",
    "max_number_of_runs",
    "max_processes_and_or_threads",
    "max_queue_size",
    "max_stack_limit",
    "max_submission_batch_size",
    "max_wall_time_limit",
    "memory_limit",
    "number_of_runs",
    "redirect_stderr_to_stdout",
    "stack_limit",
    "submission_cache_duration",
    "use_docs_as_homepage",
    "wall_time_limit",
];

#[tokio::test]
async fn judge0_describes_itself_as_1_13_1_with_every_config_field_and_language() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    let (status, about) = s.send("GET", "/about", None).await;
    assert_eq!((status, about["version"].as_str()), (200, Some("1.13.1")));
    let (_, config) = s.send("GET", "/config_info", None).await;
    let keys: Vec<&str> = config
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, JUDGE0_CONFIG_FIELDS, "every field, no other");
    assert_eq!(config["max_wall_time_limit"], 3600.0);
    assert_eq!(config["memory_limit"], 512 * 1024);
    let (_, languages) = s.send("GET", "/languages", None).await;
    let ids: Vec<i64> = languages
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_i64().unwrap())
        .collect();
    for id in [48, 49, 50, 75, 52, 53, 54, 76, 62, 63, 71, 73, 60, 1001] {
        assert!(ids.contains(&id), "GET /languages lacks {id}");
    }
    let (status, python) = s.send("GET", "/languages/71", None).await;
    assert_eq!(status, 200);
    assert_eq!(python["source_file"], "main.py");
    assert_eq!(python["is_archived"], false);
    assert_eq!(s.send("GET", "/languages/70", None).await.0, 404);
    assert_eq!(s.send("GET", "/languages/x", None).await.0, 404);
    let (_, statuses) = s.send("GET", "/statuses", None).await;
    assert_eq!(statuses.as_array().unwrap().len(), 14);
    assert_eq!(statuses[3], json!({"id": 4, "description": "Wrong Answer"}));
}

#[tokio::test]
async fn judge0_submissions_run_poll_compare_and_refuse_as_judge0() {
    let s = start(fake_manager(&fake_with_output(), |_| {}), Some(TOKEN)).await;
    let b64 = |t: &str| base64_encode(t);
    // As the official SDK: base64, wait=false, then poll with fields=*, X-Auth-Token.
    let post = |path: &str, body: Value| {
        s.http
            .post(s.url(path))
            .header("x-auth-token", TOKEN)
            .json(&body)
            .send()
    };
    let r = post(
        "/submissions?base64_encoded=true&wait=false",
        json!({"source_code": b64("x"), "language_id": 63, "expected_output": b64("hi")}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let token = r.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(token.len(), 36, "a hyphenated UUID: {token}");
    let mut sub = Value::Null;
    for _ in 0..100 {
        let (status, v) = s
            .send(
                "GET",
                &format!("/submissions/{token}?base64_encoded=true&fields=*"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{v}");
        sub = v;
        if sub["status"]["id"].as_i64() > Some(2) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        sub["status"],
        json!({"id": 3, "description": "Accepted"}),
        "{sub}"
    );
    assert_eq!(sub["stdout"], b64("hi\n"));
    assert_eq!(sub["source_code"], b64("x"));
    assert_eq!(sub["language_id"], 63);
    assert_eq!(sub["token"], token);
    assert!(sub["created_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        sub.as_object().unwrap().len(),
        35,
        "fields=* is every Judge0 field, no other (the SDK refuses unknown ones)"
    );
    let (_, v) = s
        .send(
            "GET",
            &format!("/submissions/{token}?fields=*,codebox_status"),
            None,
        )
        .await;
    assert_eq!(v["codebox_status"], "succeeded");
    assert_eq!(v.as_object().unwrap().len(), 36);
    let (_, v) = s.send("GET", &format!("/submissions/{token}"), None).await;
    assert_eq!(
        v["codebox_status"], "succeeded",
        "in the default answer: {v}"
    );

    // wait=true, plain text, a wrong answer; the 32-hex form of the token works too.
    let r = post(
        "/submissions?wait=true",
        json!({"source_code": "x", "language_id": "63", "stdin": "in", "expected_output": "bye"}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["status"]["id"], 4, "{v}");
    assert_eq!(v["stdout"], "hi\n");
    let hex = v["token"].as_str().unwrap().replace('-', "");
    let (status, v) = s
        .send(
            "GET",
            &format!("/submissions/{hex}?fields=status_id,stdin"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v, json!({"status_id": 4, "stdin": "in"}));

    // Batches.
    let r = post(
        "/submissions/batch",
        json!({"submissions": [{"source_code": "x", "language_id": 63}, {"source_code": "x", "language_id": 5}]}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 201);
    let v: Value = r.json().await.unwrap();
    assert!(v[0]["token"].is_string(), "{v}");
    assert_eq!(
        v[1],
        json!({"language_id": ["language with id 5 doesn't exist"]})
    );
    let t = v[0]["token"].as_str().unwrap();
    let (status, v) = s
        .send(
            "GET",
            &format!(
                "/submissions/batch?tokens={t},00000000-0000-4000-8000-000000000000&fields=token"
            ),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(v, json!({"submissions": [{"token": t}, null]}));

    // Refusals in Judge0's shape.
    for (body, field, message) in [
        (json!({"source_code": "x"}), "language_id", "can't be blank"),
        (json!({"language_id": 71}), "source_code", "can't be blank"),
        (
            json!({"source_code": "x", "language_id": 70}),
            "language_id",
            "language with id 70 doesn't exist",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "wall_time_limit": 99999}),
            "wall_time_limit",
            "must be less than or equal to 3600",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "memory_limit": 100}),
            "memory_limit",
            "must be greater than or equal to 6144",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "cpu_time_limit": "soon"}),
            "cpu_time_limit",
            "is not a number",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "enable_network": true}),
            "enable_network",
            "enabling network is not allowed",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "callback_url": "http://127.0.0.1:1/"}),
            "callback_url",
            "setting callback is not allowed",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "number_of_runs": 3}),
            "number_of_runs",
            "must be less than or equal to 1",
        ),
        (
            json!({"source_code": "x", "language_id": 71, "enable_per_process_and_thread_time_limit": true}),
            "enable_per_process_and_thread_time_limit",
            "this option cannot be enabled",
        ),
    ] {
        let r = post("/submissions", body.clone()).await.unwrap();
        assert_eq!(r.status(), 422, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v[field], json!([message]), "{body}: {v}");
    }
    let r = post(
        "/submissions?base64_encoded=true",
        json!({"source_code": "not base64!", "language_id": 71}),
    )
    .await
    .unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.json::<Value>().await.unwrap()["source_code"].is_array());
    let (status, v) = s
        .send(
            "GET",
            &format!("/submissions/{token}?fields=nope,token"),
            None,
        )
        .await;
    assert_eq!(
        (status, v),
        (400, json!({"error": "invalid fields: [nope]"}))
    );
    let (status, _) = s.send("GET", "/submissions/12345", None).await;
    assert_eq!(status, 404);
    let (status, v) = s
        .send("DELETE", &format!("/submissions/{token}"), None)
        .await;
    assert_eq!((status, v), (400, json!({"error": "delete not allowed"})));
    let (status, _) = s.send("GET", "/submissions/batch", None).await;
    assert_eq!(status, 400);
    let r = s.http.get(s.url("/config_info")).send().await.unwrap();
    assert_eq!(r.status(), 401, "no token");
    let r = s
        .http
        .get(s.url("/config_info"))
        .header("x-auth-token", "wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "a wrong X-Auth-Token");
    let r = s
        .http
        .get(s.url("/v1/languages"))
        .header("x-auth-token", TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "X-Auth-Token is Judge0's, not /v1's");
}

fn base64_encode(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

#[tokio::test]
async fn a_session_over_the_sessions_memory_share_is_invalid_argument_naming_the_ceiling() {
    let fake = Arc::new(FakeEngine::new());
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    let body = r#"{"language": "python", "limits": {"memory_mb": 5000}}"#;
    let (status, e) = s.send("POST", "/v1/sessions", Some(body)).await;
    assert_eq!(
        (status, code_and_field(&e)),
        (
            400,
            (
                "invalid_argument".to_string(),
                Some("limits.memory_mb".to_string())
            )
        ),
        "over sessions.memory_budget_mb (4096 MB) a session can never open: {e}"
    );
    assert!(
        e["error"]["message"].as_str().unwrap().contains("4096 MB"),
        "{e}"
    );
    let (_, doc) = s.send("GET", "/v1/openapi.json", None).await;
    let limits = doc["components"]["schemas"]["SessionRequest"]["properties"]["limits"]
        ["description"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(
        limits.contains("4096"),
        "the OpenAPI document states the ceiling: {limits}"
    );
    let (_, catalog) = s.send("GET", "/v1/languages", None).await;
    assert_eq!(
        catalog["limits"]["session_ceilings"]["memory_mb"], 4096,
        "{catalog}"
    );
}

#[tokio::test]
async fn v1_a_session_whose_packages_fail_to_install_is_invalid_argument_naming_packages() {
    let fake = Arc::new(FakeEngine::new());
    // The install container: the package manager finds no such requirement.
    fake.set_default(codebox::engine::fake::Behaviour::Exit {
        code: 1,
        stdout: String::new(),
        stderr: "ERROR: No matching distribution found for reqeusts\n".into(),
    });
    let data = tempfile::tempdir().unwrap();
    let m = fake_manager(&fake, |c| {
        c.data_dir = data.path().to_path_buf();
        c.packages.python.index_url = Some("http://127.0.0.1:9/simple".into());
    });
    let s = start(m, Some(TOKEN)).await;
    let body = r#"{"language": "python", "packages": ["reqeusts"]}"#;
    let (status, e) = s.send("POST", "/v1/sessions", Some(body)).await;
    assert_eq!(
        (status, code_and_field(&e)),
        (400, ("invalid_argument".into(), Some("packages".into()))),
        "a client's misspelt requirement is its own to fix, not a retry: {e}"
    );
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("reqeusts"), "{e}");
}
