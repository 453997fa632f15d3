//! Any server of a cluster answers for the runs and sessions another holds (SPEC section 15):
//! a call about them is forwarded to the holder, over MCP and over `/v1`, and the client sees
//! the holder's answer (not a 409 naming it). The servers' own route takes only the cluster
//! secret; `/healthz` tells a balancer the capacity.

use std::time::{Duration, Instant};

use rmcp::model::{ClientRequest, Request};
use rmcp::service::PeerRequestOptions;
use serde_json::{json, Value};

use crate::cluster::{
    get_json, known, ok, open_session, post_json, start, start_cluster, stop_all, tool_error,
    Client, SECRET,
};
use crate::common::leftovers;
use crate::mcp_support::{eventually, params, TOKEN};
use crate::serve_child::ServeChild;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_server_answers_for_the_runs_and_sessions_another_holds() {
    let t0 = Instant::now();
    let mut cluster = start_cluster("forward", &[&[], &[]]).await;
    let [mut a, mut b] = cluster.servers();
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    let http = reqwest::Client::new();
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    let (slow, long) = a_run_another_holds_is_read_and_stopped(&ca, &cb).await;
    a_session_another_holds_is_used_over_mcp(&ca, &cb).await;
    a_session_another_holds_is_used_over_v1(&http, &a, &b).await;
    let id = a_run_another_holds_is_waited_for_over_v1(&http, &a, &b, &cb).await;
    the_servers_route_takes_only_the_cluster_secret(&http, &a, &id).await;

    // Capacity, for a balancer.
    let health: Value = http
        .get(a.http_url("/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["capacity"]["slots"], 4, "{health}");
    assert!(health["capacity"]["memory_budget_mb"].as_u64().unwrap() > 0);

    drop((ca, cb));
    stop_all([&mut a, &mut b]).await;
    for run in [&slow, &long, &id] {
        assert!(leftovers(run).is_empty(), "run {run} left containers");
    }
    eprintln!("whole test {:.1} s", t0.elapsed().as_secs_f64());
}

/// `get_result` through B of a run A holds: A's own report, as it stands, then at its end;
/// `stop_run` through B stops A's run. The two runs' ids.
async fn a_run_another_holds_is_read_and_stopped(ca: &Client, cb: &Client) -> (String, String) {
    // Long enough to be unfinished when B asks, however loaded the machine.
    let slow = start(ca, "import time\ntime.sleep(6)\nprint('slow')").await;
    known(cb, &slow).await;
    let now = ok(cb, "get_result", json!({"run_id": slow})).await;
    assert!(
        matches!(now["status"].as_str(), Some("queued" | "running")),
        "{now}"
    );
    let done = ok(
        cb,
        "get_result",
        json!({"run_id": slow, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(
        (done["status"].as_str(), done["stdout"].as_str()),
        (Some("succeeded"), Some("slow\n")),
        "{done}"
    );

    // stop_run on B stops A's run (its containers are gone when it answers, on A).
    let long = start(ca, "import time\ntime.sleep(600)").await;
    known(cb, &long).await;
    eventually(60, "the long run's containers exist", || {
        !leftovers(&long).is_empty()
    })
    .await;
    let stopped = ok(cb, "stop_run", json!({"run_id": long})).await;
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    eventually(30, "the stopped run's containers are removed", || {
        leftovers(&long).is_empty()
    })
    .await;
    (slow, long)
}

/// A session opened on A, used through B over MCP: executions, a file, a cancelled
/// `run_code`, the close.
async fn a_session_another_holds_is_used_over_mcp(ca: &Client, cb: &Client) {
    let sid = open_session(ca, "python").await;
    let r = ok(
        cb,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "x = 41\nopen('f.txt', 'w').write('hi')"}),
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{r}");
    let r = ok(
        ca,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(x + 1)"}),
    )
    .await;
    assert_eq!(r["stdout"], "42\n", "the state made through B is A's: {r}");
    let f = ok(
        cb,
        "read_session_file",
        json!({"session_id": sid, "path": "f.txt"}),
    )
    .await;
    assert_eq!(f["size_bytes"], 2, "{f}");
    steps_direct_and_forwarded(ca, cb, &sid).await;
    a_forwarded_run_code_cancelled_stops_on_the_holder(ca, cb, &sid).await;
    let listed = ok(cb, "list_sessions", json!({})).await;
    assert_eq!(
        listed["sessions"],
        json!([]),
        "B lists only its own: {listed}"
    );
    let closed = ok(cb, "close_session", json!({"session_id": sid})).await;
    assert_eq!(
        (closed["closed"].as_bool(), closed["executions"].as_u64()),
        (Some(true), Some(3 + 2 * STEPS as u64)),
        "{closed}"
    );
    let ended = tool_error(
        ca,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(x)"}),
    )
    .await;
    assert!(ended.contains("closed"), "{ended}");
}

/// The same over `/v1`: open on B, execute and read on A, close on A.
async fn a_session_another_holds_is_used_over_v1(
    http: &reqwest::Client,
    a: &ServeChild,
    b: &ServeChild,
) {
    let created = post_json(
        http,
        &b.http_url("/v1/sessions"),
        json!({"language": "python"}),
    )
    .await;
    let sid2 = created["session_id"]
        .as_str()
        .expect("a session")
        .to_string();
    let run = post_json(
        http,
        &a.http_url("/v1/runs"),
        json!({"language": "python", "session_id": sid2, "code": "open('g.txt', 'w').write('abc')\nprint('in b')"}),
    )
    .await;
    assert_eq!(
        (run["status"].as_str(), run["stdout"].as_str()),
        (Some("succeeded"), Some("in b\n")),
        "{run}"
    );
    let file = http
        .get(a.http_url(&format!("/v1/sessions/{sid2}/files/g.txt")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(file.status(), 200);
    let file: Value = file.json().await.unwrap();
    assert_eq!(file["content_base64"], "YWJj", "{file}");
    let closed = http
        .delete(a.http_url(&format!("/v1/sessions/{sid2}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    let closed: Value = closed.json().await.unwrap();
    assert_eq!(closed["closed"], true, "{closed}");
}

/// `GET /v1/runs/{id}` on B, waiting, for a run accepted by A; its id.
async fn a_run_another_holds_is_waited_for_over_v1(
    http: &reqwest::Client,
    a: &ServeChild,
    b: &ServeChild,
    cb: &Client,
) -> String {
    let accepted = post_json(
        http,
        &a.http_url("/v1/runs"),
        json!({"language": "python", "code": "import time\ntime.sleep(1)\nprint('v1')", "wait": false}),
    )
    .await;
    let id = accepted["run_id"].as_str().unwrap().to_string();
    known(cb, &id).await;
    let got = get_json(http, &b.http_url(&format!("/v1/runs/{id}?wait_seconds=30"))).await;
    assert_eq!(
        (got["status"].as_str(), got["stdout"].as_str()),
        (Some("succeeded"), Some("v1\n")),
        "{got}"
    );

    id
}

/// The servers' own route takes only the cluster secret; a wrong one is no token either.
async fn the_servers_route_takes_only_the_cluster_secret(
    http: &reqwest::Client,
    a: &ServeChild,
    id: &str,
) {
    let forwarded = http
        .post(a.http_url("/cluster/tools/get_result"))
        .bearer_auth(TOKEN)
        .json(&json!({"run_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 401);
    let wrong = http
        .get(a.http_url(&format!("/v1/runs/{id}")))
        .header("x-codebox-cluster", "not-the-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right: Value = http
        .post(a.http_url("/cluster/tools/get_result"))
        .header("x-codebox-cluster", SECRET)
        .json(&json!({"run_id": id}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(right["structuredContent"]["status"], "succeeded", "{right}");
}

/// Session steps taken through each server in turn: for docs/PERFORMANCE.md, the medians of
/// a step on the session's own server and forwarded from the other (printed, not asserted).
const STEPS: usize = 15;

async fn steps_direct_and_forwarded(ca: &Client, cb: &Client, sid: &str) {
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        for (client, times) in [(ca, &mut direct), (cb, &mut forwarded)] {
            let t = Instant::now();
            let r = ok(
                client,
                "run_code",
                json!({"language": "python", "session_id": sid, "code": "pass"}),
            )
            .await;
            times.push(t.elapsed());
            assert_eq!(r["status"], "succeeded", "{r}");
        }
    }
    direct.sort();
    forwarded.sort();
    let median = |v: &[Duration]| v[v.len() / 2].as_secs_f64() * 1e3;
    eprintln!(
        "a session step over MCP: direct median {:.1} ms, forwarded median {:.1} ms ({STEPS} each)",
        median(&direct),
        median(&forwarded)
    );
}

/// Cancelling a `run_code` that B forwarded stops the execution on A.
async fn a_forwarded_run_code_cancelled_stops_on_the_holder(ca: &Client, cb: &Client, sid: &str) {
    let request = ClientRequest::CallToolRequest(Request::new(params(
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "import time\ntime.sleep(25)"}),
    )));
    let handle = cb
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let mut cancelled = None;
    for _ in 0..400 {
        let rows = ok(
            cb,
            "get_execution_history",
            json!({"session_id": sid, "status": "running"}),
        )
        .await;
        if let Some(r) = rows["runs"].as_array().unwrap().first() {
            cancelled = Some(r["run_id"].as_str().unwrap().to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let cancelled = cancelled.expect("the forwarded execution runs on A");
    handle
        .cancel(Some("user pressed stop".into()))
        .await
        .unwrap();
    let r = ok(
        ca,
        "get_result",
        json!({"run_id": cancelled, "wait_seconds": 20}),
    )
    .await;
    assert_eq!(r["status"], "stopped", "{r}");
}
