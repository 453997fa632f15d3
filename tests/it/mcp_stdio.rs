//! The real `codebox serve` binary over stdio, as an MCP client starts it: the protocol on
//! stdout, logs on stderr; and a history database that cannot be written does not stop runs.

use std::process::Stdio;
use std::time::Instant;

use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
use serde_json::json;
use tokio::io::AsyncReadExt;

use crate::common::codebox_bin;
use crate::mcp_support::params;

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
    assert_eq!(client.list_all_tools().await.unwrap().len(), 6);
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
