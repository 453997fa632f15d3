//! Crash: the real binary serving HTTP is killed with SIGKILL while runs are active; the next
//! start removes the runs' containers and marks their history rows.

use serde_json::json;

use crate::common::leftovers;
use crate::mcp_support::{eventually, params};
use crate::serve_child::{Options, ServeChild};

const TOKEN: &str = "crash-test-token-0123456789";

/// Running run-stage containers of this run (the compile stage's do not count).
fn running(run_id: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("name=codebox-{run_id}-run"),
        ])
        .output()
        .expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// A `codebox serve --transport http` child in `data`, on a free port.
async fn start(data: tempfile::TempDir) -> ServeChild {
    ServeChild::start_in(
        data,
        Options {
            http_token: Some(TOKEN),
            log: "info,bollard=warn",
            echo_stderr: true,
            ..Options::default()
        },
    )
    .await
}

#[tokio::test]
async fn after_a_sigkill_the_next_start_removes_the_runs_containers_and_marks_their_history() {
    let mut server = start(tempfile::tempdir().unwrap()).await;
    let client = server.client(TOKEN).await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let res = client
            .call_tool(params(
                "start_run",
                json!({"language": "python", "code": "import time\ntime.sleep(600)", "limits": {"timeout_seconds": 900}}),
            ))
            .await
            .unwrap();
        ids.push(
            res.structured_content.unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    for id in &ids {
        eventually(60, "the run's program runs", || running(id) == 1).await;
    }
    drop(client);
    server.signal_and_wait(libc::SIGKILL).await;
    for id in &ids {
        assert!(
            !leftovers(id).is_empty(),
            "a killed server cannot clean up; the containers of {id} must still be there"
        );
    }

    let mut server = start(server.into_data()).await;
    for id in &ids {
        eventually(30, "the dead server's containers are removed", || {
            leftovers(id).is_empty()
        })
        .await;
    }
    let client = server.client(TOKEN).await;
    let res = client
        .call_tool(params("get_execution_history", json!({"limit": 10})))
        .await
        .unwrap();
    let runs = res.structured_content.unwrap()["runs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert!(ids.contains(&r["run_id"].as_str().unwrap().to_string()));
        assert_eq!(r["status"], "sandbox_error", "{r}");
        assert_eq!(r["message"], "interrupted by server restart", "{r}");
    }
    let metrics = reqwest::Client::new()
        .get(server.http_url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reaped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("codebox_containers_reaped_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(reaped >= 2, "{metrics}");
    drop(client);
    server.signal_and_wait(libc::SIGTERM).await;
}
