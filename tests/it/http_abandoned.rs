//! A client that goes away while it waits for its run stops the run, at each door that waits
//! (`POST /v1/runs`, Piston's `/api/v2/execute`, Judge0's `POST /submissions?wait=true`),
//! whether it closes its socket (a FIN, as `curl --max-time` does) or resets it. Real Docker,
//! the transport's own connection handling, one run slot: the run ends `stopped` (a 20 s
//! `sleep` that was not stopped would end `succeeded`) and the next run is admitted at once.
//! A client that only closes its sending side still gets its answer.

use std::time::Duration;

use codebox::contract::RunRequest;
use codebox::history::Query;
use codebox::report::Status;
use codebox::runs::RunManager;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::mcp_support::{docker_manager, settle, temp_history};

#[derive(Debug, Clone, Copy)]
enum Door {
    V1,
    Piston,
    Judge0,
}

/// A request at `door` that waits for a bash `sleep` of `seconds`.
fn request(door: Door, seconds: u32) -> Vec<u8> {
    let code = format!("sleep {seconds}; echo done");
    let (path, body) = match door {
        Door::V1 => (
            "/v1/runs",
            json!({"language": "bash", "code": code, "limits": {"timeout_seconds": 60}}),
        ),
        Door::Piston => (
            "/api/v2/execute",
            json!({"language": "bash", "version": "*", "files": [{"content": code}], "run_timeout": 60000}),
        ),
        Door::Judge0 => (
            "/submissions?wait=true",
            json!({"language_id": 46, "source_code": code, "wall_time_limit": 60, "cpu_time_limit": 60}),
        ),
    };
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The id of the newest run of the history once it is running.
async fn running_run(m: &RunManager) -> String {
    newest_run(m, None, true).await
}

/// The id of the newest run of the history that is not `not` (and is running, with
/// `running`).
async fn newest_run(m: &RunManager, not: Option<&str>, running: bool) -> String {
    let history = m.history().expect("a history");
    for _ in 0..600 {
        let rows = history
            .query(Query {
                limit: Some(1),
                ..Default::default()
            })
            .await
            .unwrap();
        if let Some(row) = rows.first().filter(|r| Some(r.run_id.as_str()) != not) {
            if !running || m.report(&row.run_id).map(|r| r.status) == Some(Status::Running) {
                return row.run_id.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no new run within 30 s");
}

#[derive(Debug, Clone, Copy)]
enum Close {
    /// `close()`: a FIN.
    Fin,
    /// `SO_LINGER` 0, then `close()`: a reset.
    Reset,
}

async fn goes_away_and_its_run_stops(door: Door) {
    let (history, _dir) = temp_history();
    let m = docker_manager(|c| c.runs.max_concurrent_runs = 1, Some(history));
    let served = crate::http::start(m.clone(), None).await;
    for close in [Close::Fin, Close::Reset] {
        let mut c = TcpStream::connect(served.addr).await.unwrap();
        c.write_all(&request(door, 20)).await.unwrap();
        let id = running_run(&m).await;
        if let Close::Reset = close {
            c.set_zero_linger().unwrap();
        }
        drop(c);
        let report = m.wait_end(&id).await.unwrap();
        assert_eq!(
            report.status,
            Status::Stopped,
            "{door:?}, {close:?}: a run whose waiting client went away is stopped: {report:?}"
        );
        let next = m
            .submit(RunRequest {
                language: "bash".into(),
                code: "echo next".into(),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(
            next.status,
            Status::Running,
            "{door:?}, {close:?}: the stopped run's slot is free for the next run"
        );
        m.wait_end(&next.run_id).await.unwrap();
    }
    drop(served);
    settle(&m).await;
}

#[tokio::test]
async fn a_v1_client_that_goes_away_stops_its_run() {
    goes_away_and_its_run_stops(Door::V1).await;
}

#[tokio::test]
async fn a_piston_client_that_goes_away_stops_its_run() {
    goes_away_and_its_run_stops(Door::Piston).await;
}

#[tokio::test]
async fn a_judge0_client_that_goes_away_stops_its_run() {
    goes_away_and_its_run_stops(Door::Judge0).await;
}

#[tokio::test]
async fn a_client_that_only_closes_its_sending_side_still_gets_its_answer() {
    let (history, _dir) = temp_history();
    let m = docker_manager(|_| {}, Some(history));
    let served = crate::http::start(m.clone(), None).await;
    let mut previous: Option<String> = None;
    for door in [Door::V1, Door::Piston, Door::Judge0] {
        let mut c = TcpStream::connect(served.addr).await.unwrap();
        c.write_all(&request(door, 2)).await.unwrap();
        previous = Some(newest_run(&m, previous.as_deref(), false).await);
        c.shutdown().await.unwrap();
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(60), c.read_to_end(&mut answer))
            .await
            .unwrap_or_else(|_| panic!("{door:?}: no answer within 60 s"))
            .unwrap();
        let answer = String::from_utf8_lossy(&answer);
        let last = answer.rsplit("HTTP/1.1 ").next().unwrap_or("");
        assert!(
            (last.starts_with("200") || last.starts_with("201")) && answer.contains("done"),
            "{door:?}: a half-closed client gets its whole answer: {answer}"
        );
    }
    drop(served);
    settle(&m).await;
}
