//! A server of a cluster killed outright loses what it held within its lease (SPEC section
//! 15): until then the others say it does not answer; then they mark its running run
//! `sandbox_error` ("its server stopped answering") and end its session ("the server that
//! held it stopped"), and keep serving. Its containers stay on its own Docker host until a
//! server starts again on its data directory, which reaps them.

use std::time::Instant;

use serde_json::json;

use crate::cluster::{
    known, left_only_on, ok, open_session, private_hosts, reaped, running_on, start_cluster_on,
    start_lang, stop_all, tool_error, until_sandbox_error,
};
use crate::mcp_support::TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_loses_its_runs_and_sessions_within_its_lease() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let lease: &[&str] = &["cluster.lease_seconds=3"];
    let mut cluster = start_cluster_on("lease", &[lease, lease], hosts).await;
    let [mut a, mut b] = cluster.servers();
    let instance_a = a.instance().await;
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);

    let long = start_lang(&ca, "bash", "sleep 600").await;
    let sid = open_session(&ca, "bash").await;
    known(&cb, &long).await;
    running_on(
        &hosts[0],
        &long,
        "the long run's containers exist on A's host",
    )
    .await;
    // While A answers, B forwards: the run is running there.
    let r = ok(&cb, "get_result", json!({"run_id": long})).await;
    assert_eq!(r["status"], "running", "{r}");

    drop(ca);
    a.signal_and_wait(libc::SIGKILL).await;
    let killed = Instant::now();
    // Until A's lease lapses, B still takes A for the run's holder: the call fails saying
    // that A does not answer (and to try again), or, between the lapse and B's next renewal
    // (which marks what A held), that A holds it; then B answers from the store.
    let mut unanswered = 0;
    let last = until_sandbox_error(&cb, &long, |msg| {
        assert!(
            (msg.contains("does not answer") || msg.contains("another codebox server"))
                && msg.contains(&instance_a),
            "{msg}"
        );
        unanswered += 1;
    })
    .await;
    let noticed = killed.elapsed();
    assert_eq!(
        (last["status"].as_str(), last["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{last}"
    );
    let ended = tool_error(
        &cb,
        "run_code",
        json!({"language": "bash", "session_id": sid, "code": "echo 1"}),
    )
    .await;
    assert!(ended.contains("the server that held it stopped"), "{ended}");
    // B keeps serving.
    let r = ok(
        &cb,
        "run_code",
        json!({"language": "bash", "code": "echo still"}),
    )
    .await;
    assert_eq!(r["stdout"], "still\n", "{r}");

    // A's containers (its run's, its session's) stay on A's host, the only one that has
    // any, until that host gets a server again (on A's data directory), which reaps them.
    left_only_on(hosts, 0, &instance_a);
    let mut a2 = cluster.restart_on(a, lease, &hosts[0]).await;
    reaped(&hosts[0], &instance_a).await;
    eprintln!(
        "lease 3 s: the killed server's run was marked {:.1} s after the kill ({unanswered} calls \
         in between said its server does not answer); whole test {:.1} s",
        noticed.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(cb);
    stop_all([&mut a2, &mut b]).await;
}
