//! SIGTERM drains a server of a cluster (SPEC section 15): it says so on `/healthz`, refuses
//! new runs, finishes every run it holds (running or queued), answered through another
//! server, records each, and exits cleanly.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{known, ok, start, start_cluster, stop_all, tool_error};
use crate::common::leftovers;
use crate::mcp_support::{eventually, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_server_finishing_what_it_holds_and_losing_nothing() {
    let t0 = Instant::now();
    let mut cluster = start_cluster("drain", &[&["runs.max_concurrent_runs=2"], &[]]).await;
    let [mut a, mut b] = cluster.servers();
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    const RUNS: usize = 6;
    let mut ids = Vec::new();
    for i in 0..RUNS {
        ids.push(start(&ca, &format!("import time\ntime.sleep(1.5)\nprint({i})")).await);
    }
    known(&cb, ids.last().unwrap()).await;
    // Two run, four wait in A's queue when A is told to stop.
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(a.pid(), libc::SIGTERM) }, 0);
    let http = reqwest::Client::new();
    eventually(30, "A's /healthz says it drains", || {
        let url = a.http_url("/healthz");
        let http = http.clone();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async { http.get(url).send().await.map(|r| r.status().as_u16()) })
        })
        .join()
        .unwrap()
        .is_ok_and(|s| s == 503)
    })
    .await;
    let refused = tool_error(
        &ca,
        "start_run",
        json!({"language": "python", "code": "print(1)"}),
    )
    .await;
    assert!(refused.contains("shutting down"), "{refused}");
    // Every run it held ends as it would have, read through B (forwarded to A while it
    // drains, from the store once it is gone).
    for (i, id) in ids.iter().enumerate() {
        let r = ok(&cb, "get_result", json!({"run_id": id, "wait_seconds": 60})).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("{i}\n").as_str())),
            "{r}"
        );
    }
    drop(ca);
    let status = a.wait(Duration::from_secs(120)).await;
    assert!(status.success(), "A exited with {status}");
    let rows = ok(&cb, "get_execution_history", json!({"limit": 100})).await;
    let rows = rows["runs"].as_array().unwrap();
    for id in &ids {
        let row = rows
            .iter()
            .find(|r| r["run_id"] == id.as_str())
            .expect("recorded");
        assert_eq!(row["status"], "succeeded", "{row}");
    }
    for id in &ids {
        assert!(leftovers(id).is_empty(), "run {id} left containers");
    }
    eprintln!(
        "drain of {RUNS} runs: whole test {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    drop(cb);
    stop_all([&mut b]).await;
}
