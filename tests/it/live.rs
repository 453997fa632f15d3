//! Live output (SPEC section 14) on real Docker: `GET /v1/runs/{id}/events` as a client reads
//! it (reqwest, reading the stream as it comes), `Last-Event-ID`, a client going away, a
//! session's execution, and MCP progress carrying the newest output.

use std::time::Duration;

use serde_json::{json, Value};

use crate::http_api::{start, Server, TOKEN};
use crate::mcp_support::{connect, docker_manager, labelled, settle};
use codebox::runs::RunManager;

/// One Server-Sent Event.
#[derive(Debug, Clone)]
pub struct Sse {
    pub id: String,
    pub event: String,
    pub data: Value,
}

/// An open event stream, read as it comes.
pub struct Events {
    response: reqwest::Response,
    buf: String,
}

impl Events {
    pub async fn open(server: &Server, run_id: &str, last: Option<&str>) -> Events {
        let mut r = reqwest::Client::new()
            .get(server.url(&format!("/v1/runs/{run_id}/events")))
            .bearer_auth(TOKEN);
        if let Some(last) = last {
            r = r.header("last-event-id", last);
        }
        let response = r.send().await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Events {
            response,
            buf: String::new(),
        }
    }

    /// The next event; `None` when the stream ends.
    pub async fn next(&mut self) -> Option<Sse> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut id, mut event, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim_start().to_string();
                    } else if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim_start().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.strip_prefix(' ').unwrap_or(v));
                    }
                }
                if event.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(Sse {
                    id,
                    event,
                    data: serde_json::from_str(&data).unwrap(),
                });
            }
            let chunk = tokio::time::timeout(Duration::from_secs(120), self.response.chunk())
                .await
                .expect("an event within 2 minutes")
                .unwrap()?;
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

/// `n` lines, three a second, each flushed.
fn ticking(n: usize) -> String {
    format!("import time\nfor i in range({n}):\n    print(f'line {{i}}', flush=True)\n    time.sleep(1/3)\n")
}

pub async fn start_run(server: &Server, body: Value) -> String {
    let (status, accepted) = server
        .send("POST", "/v1/runs", Some(&body.to_string()))
        .await;
    assert_eq!(status, 202, "{accepted}");
    accepted["run_id"].as_str().unwrap().to_string()
}

fn stdout_of(events: &[Sse]) -> String {
    events
        .iter()
        .filter(|e| e.event == "stdout")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect()
}

/// Nothing of the run is left once its removals are done. A test that returns while one is
/// under way leaves the container behind: the removal task ends with the test's runtime.
async fn nothing_left(m: &RunManager, run_id: &str) {
    settle(m).await;
    let left = labelled(run_id);
    assert!(left.is_empty(), "run {run_id} left {left:?}");
}

async fn live_readers(server: &Server) -> u64 {
    let text = reqwest::Client::new()
        .get(server.url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("codebox_live_readers "))
        .expect("the gauge")
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn events_arrive_while_the_program_runs_in_order_and_end_with_the_report() {
    let m = docker_manager(|_| {}, None);
    let server = start(m.clone(), Some(TOKEN)).await;
    let id = start_run(
        &server,
        json!({"language": "python", "code": ticking(9), "wait": false}),
    )
    .await;
    let mut stream = Events::open(&server, &id, None).await;
    let mut events = Vec::new();
    let mut running_at_first_output = None;
    while let Some(e) = stream.next().await {
        if e.event == "stdout" && running_at_first_output.is_none() {
            // Still running when its first line arrives: the output was not held to the end.
            let (_, r) = server.send("GET", &format!("/v1/runs/{id}"), None).await;
            running_at_first_output = Some(r["status"].as_str().unwrap().to_string());
        }
        events.push(e);
    }
    assert_eq!(running_at_first_output.as_deref(), Some("running"));
    let names: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"queued"), "{names:?}");
    assert_eq!(names.get(1), Some(&"started"), "{names:?}");
    assert_eq!(events[1].data["stage"], "run");
    assert_eq!(names.last(), Some(&"report"), "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "report").count(), 1);
    let ids: Vec<u64> = events.iter().map(|e| e.id.parse().unwrap()).collect();
    assert_eq!(ids, (1..=events.len() as u64).collect::<Vec<_>>());
    let expected: String = (0..9).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout_of(&events), expected);
    let report = &events.last().unwrap().data;
    assert_eq!(report["status"], "succeeded");
    assert_eq!(report["stdout"], expected.as_str());

    // Ended: the report at once, and nothing else.
    let mut again = Events::open(&server, &id, None).await;
    let only = again.next().await.unwrap();
    assert_eq!(only.event, "report");
    assert_eq!(only.data["run_id"], report["run_id"]);
    assert!(again.next().await.is_none());
    nothing_left(&m, &id).await;
}

#[tokio::test]
async fn last_event_id_resumes_and_a_client_that_goes_away_costs_nothing() {
    let m = docker_manager(|_| {}, None);
    let server = start(m.clone(), Some(TOKEN)).await;
    let id = start_run(
        &server,
        json!({"language": "python", "code": ticking(9), "wait": false}),
    )
    .await;
    let mut first = Vec::new();
    {
        let mut stream = Events::open(&server, &id, None).await;
        while let Some(e) = stream.next().await {
            first.push(e);
            if stdout_of(&first).contains("line 1\n") {
                break;
            }
        }
        assert_eq!(live_readers(&server).await, 1, "{first:?}");
    }
    // Gone: no reader is left (the server noticed the closed connection).
    let mut readers = 1;
    for _ in 0..300 {
        readers = live_readers(&server).await;
        if readers == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        readers, 0,
        "the server still holds the reader that went away"
    );
    let last = first.last().unwrap().id.clone();
    let mut rest = Vec::new();
    let mut stream = Events::open(&server, &id, Some(&last)).await;
    while let Some(e) = stream.next().await {
        rest.push(e);
    }
    assert_eq!(
        rest[0].id.parse::<u64>().unwrap(),
        last.parse::<u64>().unwrap() + 1,
        "resumes right after the last event seen"
    );
    let all: Vec<Sse> = first.iter().chain(rest.iter()).cloned().collect();
    let expected: String = (0..9).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout_of(&all), expected, "nothing lost, nothing twice");
    let report = &rest.last().unwrap().data;
    assert_eq!(report["status"], "succeeded", "{report}");
    nothing_left(&m, &id).await;
}

#[tokio::test]
async fn a_session_execution_streams_its_output_too() {
    let m = docker_manager(|_| {}, None);
    let server = start(m.clone(), Some(TOKEN)).await;
    let (status, session) = server
        .send("POST", "/v1/sessions", Some(r#"{"language": "python"}"#))
        .await;
    assert_eq!(status, 200, "{session}");
    let sid = session["session_id"].as_str().unwrap().to_string();
    let id = start_run(
        &server,
        json!({"language": "python", "session_id": sid, "code": ticking(4), "wait": false}),
    )
    .await;
    let mut stream = Events::open(&server, &id, None).await;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e);
    }
    let expected: String = (0..4).map(|i| format!("line {i}\n")).collect();
    assert_eq!(stdout_of(&events), expected, "{events:?}");
    assert_eq!(events.last().unwrap().event, "report");
    assert_eq!(
        events.last().unwrap().data["session"]["session_id"],
        sid.as_str()
    );
    server
        .send("DELETE", &format!("/v1/sessions/{sid}"), None)
        .await;
    nothing_left(&m, &id).await;
}

#[tokio::test]
async fn files_under_outputs_are_announced_and_stderr_is_its_own_stream() {
    let m = docker_manager(|_| {}, None);
    let server = start(m.clone(), Some(TOKEN)).await;
    let code = "import os, sys\nprint('to err', file=sys.stderr, flush=True)\nos.makedirs('outputs', exist_ok=True)\nopen('outputs/a.txt','w').write('12345')\n";
    let id = start_run(
        &server,
        json!({"language": "python", "code": code, "wait": false}),
    )
    .await;
    let mut stream = Events::open(&server, &id, None).await;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e);
    }
    let err: String = events
        .iter()
        .filter(|e| e.event == "stderr")
        .map(|e| e.data["data"].as_str().unwrap())
        .collect();
    assert_eq!(err, "to err\n", "{events:?}");
    assert_eq!(stdout_of(&events), "");
    let file = events
        .iter()
        .find(|e| e.event == "file")
        .expect("a file event");
    assert_eq!(file.data, json!({"path": "outputs/a.txt", "size_bytes": 5}));
    nothing_left(&m, &id).await;
}

#[tokio::test]
async fn output_past_the_cap_ends_with_a_truncated_event() {
    let m = docker_manager(|c| c.sandbox.output_limit_bytes = 1000, None);
    let server = start(m.clone(), Some(TOKEN)).await;
    let id = start_run(
        &server,
        json!({"language": "python", "code": "print('x' * 5000)", "wait": false}),
    )
    .await;
    let mut stream = Events::open(&server, &id, None).await;
    let mut events = Vec::new();
    while let Some(e) = stream.next().await {
        events.push(e);
    }
    assert_eq!(stdout_of(&events).len(), 1000);
    let t = events
        .iter()
        .find(|e| e.event == "truncated")
        .expect("a truncated event");
    assert_eq!(t.data["stream"], "stdout");
    assert_eq!(events.last().unwrap().data["stdout_truncated"], true);
    nothing_left(&m, &id).await;
}

#[tokio::test]
async fn run_code_progress_carries_the_newest_output() {
    let m = docker_manager(|_| {}, None);
    let client = connect(m.clone()).await;
    let res = crate::mcp_support::call(
        &client,
        "run_code",
        json!({"language": "python", "code": ticking(12)}),
    )
    .await;
    assert!(res.structured_content.is_some());
    let seen = client.service().progress.lock().unwrap().clone();
    let with_output: Vec<String> = seen
        .iter()
        .filter_map(|p| p.message.clone())
        .filter(|m| m.contains("newest output") && m.contains("line "))
        .collect();
    assert!(!with_output.is_empty(), "{seen:?}");
    for m in &with_output {
        let output = m.split_once("newest output:\n").unwrap().1;
        assert!(output.lines().count() <= 10, "{m}");
        assert!(output.len() <= 1024, "{m}");
    }
    let run_id = res.structured_content.as_ref().unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    nothing_left(&m, &run_id).await;
}
