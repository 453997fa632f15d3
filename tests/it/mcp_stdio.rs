//! The real `codebox serve` binary over stdio, as an MCP client starts it: the protocol on
//! stdout, logs on stderr; and a history database that cannot be written does not stop runs.
//! Plus the stdio transport in-process (`LineTransport` over a duplex pipe, the fake engine)
//! for what the protocol fuzzer found: hostile messages before `initialize`, and ids reused
//! while in flight; and a SIGTERM before the client initialized, which left the pool's
//! containers behind.

use std::process::Stdio;
use std::time::Instant;

use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::common::codebox_bin;
use crate::mcp_support::{fake_manager, params};

async fn spawn(
    envs: &[(&str, &str)],
) -> (RunningService<RoleClient, ()>, tokio::process::ChildStderr) {
    let envs: Vec<(String, String)> = envs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let cmd = tokio::process::Command::new(codebox_bin()).configure(|c| {
        c.arg("serve")
            .env_remove("CODEBOX_TOKEN")
            .envs(envs.clone());
    });
    let (transport, stderr) = TokioChildProcess::builder(cmd)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn codebox serve");
    let client = ().serve(transport).await.expect("MCP handshake over stdio");
    (client, stderr.expect("stderr piped"))
}

async fn hello(client: &RunningService<RoleClient, ()>) -> serde_json::Value {
    let res = client
        .call_tool(params(
            "run_code",
            json!({"language": "python", "code": "print('hello')"}),
        ))
        .await
        .expect("run_code");
    assert_eq!(res.is_error, Some(false), "{res:?}");
    res.structured_content.expect("structured report")
}

#[tokio::test]
async fn the_binary_serves_mcp_on_stdio_and_run_code_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let (client, mut stderr) = spawn(&[("CODEBOX_DATA_DIR", data)]).await;
    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "codebox");
    assert_eq!(client.list_all_tools().await.unwrap().len(), 10);
    // Warm-up, then the round trip of run_code for Python hello world, 20 times.
    let r = hello(&client).await;
    assert_eq!(r["stdout"], "hello\n");
    let mut times = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let r = hello(&client).await;
        times.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(r["status"], "succeeded");
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "run_code python hello over stdio: median {:.0} ms (min {:.0}, max {:.0}, n=20)",
        (times[9] + times[10]) / 2.0,
        times[0],
        times[19]
    );
    let history = client
        .call_tool(params("get_execution_history", json!({"limit": 100})))
        .await
        .unwrap();
    assert_eq!(
        history.structured_content.unwrap()["runs"]
            .as_array()
            .unwrap()
            .len(),
        21
    );
    client.cancel().await.unwrap();
    let mut log = String::new();
    stderr.read_to_string(&mut log).await.unwrap();
    assert!(!log.contains("ERROR"), "{log}");
}

#[tokio::test]
async fn runs_succeed_and_a_warning_is_logged_when_the_history_database_is_unwritable() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-folder");
    std::fs::write(&blocker, "a file where the database folder should be").unwrap();
    let db = blocker.join("history.sqlite3");
    let (client, mut stderr) = spawn(&[
        ("CODEBOX_DATA_DIR", dir.path().to_str().unwrap()),
        ("CODEBOX_HISTORY_PATH", db.to_str().unwrap()),
    ])
    .await;
    let r = hello(&client).await;
    assert_eq!(r["status"], "succeeded", "{r}");
    let started = client
        .call_tool(params(
            "start_run",
            json!({"language": "python", "code": "print(2)"}),
        ))
        .await
        .unwrap();
    let id = started.structured_content.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    let done = client
        .call_tool(params(
            "get_result",
            json!({"run_id": id, "wait_seconds": 30}),
        ))
        .await
        .unwrap();
    assert_eq!(done.structured_content.unwrap()["stdout"], "2\n");
    // The history tool says what is wrong, as a tool error.
    let h = client
        .call_tool(params("get_execution_history", json!({})))
        .await
        .unwrap();
    assert_eq!(h.is_error, Some(true));
    client.cancel().await.unwrap();
    let mut log = String::new();
    stderr.read_to_string(&mut log).await.unwrap();
    assert!(
        log.contains("WARN") && log.contains("history"),
        "expected a warning about the history database:\n{log}"
    );
}

#[tokio::test]
async fn closing_the_stdio_session_stops_unfinished_runs_and_removes_their_containers() {
    let dir = tempfile::tempdir().unwrap();
    let (client, _stderr) = spawn(&[("CODEBOX_DATA_DIR", dir.path().to_str().unwrap())]).await;
    let started = client
        .call_tool(params(
            "start_run",
            json!({"language": "python", "code": "import time\ntime.sleep(300)", "limits": {"timeout_seconds": 600}}),
        ))
        .await
        .unwrap();
    let id = started.structured_content.unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    crate::mcp_support::eventually(60, "the run's container exists", || {
        !crate::common::leftovers(&id).is_empty()
    })
    .await;
    client.cancel().await.unwrap();
    crate::mcp_support::eventually(60, "the run's containers are removed", || {
        crate::common::leftovers(&id).is_empty()
    })
    .await;
}

/// A raw line client of an in-process server on [`LineTransport`].
struct RawClient {
    write: tokio::io::WriteHalf<tokio::io::DuplexStream>,
    read: tokio::io::Lines<tokio::io::BufReader<tokio::io::ReadHalf<tokio::io::DuplexStream>>>,
}

impl RawClient {
    fn start(manager: codebox::runs::RunManager) -> RawClient {
        use rmcp::service::Service;
        let (server_io, client_io) = tokio::io::duplex(1 << 20);
        let server = codebox::mcp::CodeboxServer::new(codebox::sessions::Sessions::new(manager));
        let (r, w) = tokio::io::split(server_io);
        let supported = server.supported_protocol_versions().into_owned();
        let transport = codebox::transport::stdio::LineTransport::new(r, w, supported);
        tokio::spawn(async move {
            if let Ok(running) = server.serve(transport).await {
                let _ = running.waiting().await;
            }
        });
        let (r, w) = tokio::io::split(client_io);
        RawClient {
            write: w,
            read: tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(r)),
        }
    }

    async fn send(&mut self, v: serde_json::Value) {
        use tokio::io::AsyncWriteExt;
        self.write
            .write_all(format!("{v}\n").as_bytes())
            .await
            .unwrap();
    }

    async fn next(&mut self) -> serde_json::Value {
        let line = tokio::time::timeout(std::time::Duration::from_secs(10), self.read.next_line())
            .await
            .expect("an answer within 10 s")
            .unwrap()
            .expect("the server is still there");
        serde_json::from_str(&line).unwrap()
    }
}

fn initialize(id: i64) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}})
}

#[tokio::test]
async fn notifications_and_responses_before_initialize_do_not_end_the_stdio_session() {
    let fake = std::sync::Arc::new(codebox::engine::fake::FakeEngine::new());
    let mut c = RawClient::start(fake_manager(&fake, |_| {}));
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    c.send(json!({"jsonrpc": "2.0", "id": 99, "result": {}}))
        .await;
    c.send(json!({"jsonrpc": "2.0", "id": 98, "error": {"code": 1, "message": "x"}}))
        .await;
    c.send(initialize(1)).await;
    let init = c.next().await;
    assert_eq!(init["id"], 1, "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "codebox");
    c.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    c.send(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}))
        .await;
    assert_eq!(
        c.next().await["result"]["tools"].as_array().unwrap().len(),
        10
    );
}

#[tokio::test]
async fn a_request_reusing_an_id_in_flight_is_refused_and_the_first_keeps_its_answer() {
    let fake = std::sync::Arc::new(codebox::engine::fake::FakeEngine::new());
    fake.hang_on_start();
    let mut c = RawClient::start(fake_manager(&fake, |_| {}));
    c.send(initialize(1)).await;
    c.next().await;
    c.send(
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "start_run", "arguments": {"language": "python", "code": "print(1)"}}}),
    )
    .await;
    let started = c.next().await;
    let run_id = started["result"]["structuredContent"]["run_id"].clone();
    // A long poll with id 7, then a ping with the same id while it waits.
    c.send(
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
        "name": "get_result", "arguments": {"run_id": run_id, "wait_seconds": 2}}}),
    )
    .await;
    c.send(json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}))
        .await;
    let refused = c.next().await;
    assert_eq!(refused["id"], 7, "{refused}");
    assert_eq!(refused["error"]["code"], -32600, "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("already used"),
        "{refused}"
    );
    let polled = c.next().await;
    assert_eq!(polled["id"], 7, "{polled}");
    assert_eq!(
        polled["result"]["structuredContent"]["status"], "running",
        "{polled}"
    );
    // Answered, the id is free again.
    c.send(json!({"jsonrpc": "2.0", "id": 7, "method": "ping"}))
        .await;
    let pong = c.next().await;
    assert_eq!(
        (pong["id"].clone(), pong["result"].clone()),
        (json!(7), json!({}))
    );
}

#[tokio::test]
async fn an_invalid_request_over_stdio_is_answered_with_its_id() {
    let fake = std::sync::Arc::new(codebox::engine::fake::FakeEngine::new());
    let mut c = RawClient::start(fake_manager(&fake, |_| {}));
    c.send(initialize(1)).await;
    c.next().await;
    c.send(json!({"jsonrpc": "2.0", "id": "bad", "method": "tools/call", "params": "x"}))
        .await;
    let a = c.next().await;
    assert_eq!(
        (a["id"].clone(), a["error"]["code"].clone()),
        (json!("bad"), json!(-32600))
    );
    c.send(json!([{"jsonrpc": "2.0", "id": 5, "method": "ping"}]))
        .await;
    let a = c.next().await;
    assert_eq!(a["id"], 5, "{a}");
    assert!(
        a["error"]["message"].as_str().unwrap().contains("batch"),
        "{a}"
    );
}

#[tokio::test]
async fn sigterm_before_the_client_initializes_still_removes_the_pools_containers() {
    use crate::serve_child::{instance_objects, Options, ServeChild};
    // Found with the fuzz tests' server fixture: the signal handlers were installed only
    // once the session had started, so a SIGTERM before `initialize` (a client that starts
    // its servers and quits) killed the process at once, and the ready containers stayed
    // until their expiry label, hours later.
    let mut server = ServeChild::start(Options::default()).await;
    let instance = server.instance().await;
    crate::mcp_support::eventually(60, "the pool has containers", || {
        !instance_objects(&instance).is_empty()
    })
    .await;
    let status = server.signal_and_wait(libc::SIGTERM).await;
    assert!(status.success(), "exited with {status}");
    assert_eq!(instance_objects(&instance), Vec::<String>::new());
}
