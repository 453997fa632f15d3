//! After the shared database is away for longer than two leases, the servers of a cluster
//! reconnect and do not take each other for dead (SPEC section 15): each one's runs go on and
//! its sessions stay open, reachable through the other.

use std::time::Duration;

use serde_json::json;

use crate::cluster::{call, known, ok, open_session, start_args, start_cluster, stop_all};
use crate::common::leftovers;
use crate::mcp_support::TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_database_outage_the_servers_do_not_take_each_other_for_dead() {
    let lease: &[&str] = &["cluster.lease_seconds=3"];
    let mut cluster = start_cluster("outage", &[lease, lease]).await;
    let [mut a, mut b] = cluster.servers();
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    // Each holds a session and a run: whichever reconnects first could take the other for
    // dead.
    let mut held = Vec::new();
    for client in [&ca, &cb] {
        let sid = open_session(client, "python").await;
        let run = start_args(
            client,
            json!({"language": "python", "code": "import time\ntime.sleep(35)\nprint('through')",
                   "limits": {"timeout_seconds": 60}}),
        )
        .await;
        held.push((sid, run));
    }
    for (_, run) in &held {
        known(&ca, run).await;
        known(&cb, run).await;
    }

    // The database goes away for longer than two leases, then comes back: each server
    // reconnects (within its retry interval) and must not mark the other's work.
    cluster.pg.pause();
    tokio::time::sleep(Duration::from_secs(8)).await;
    cluster.pg.restart();
    for _ in 0..200 {
        let res = call(&ca, "get_execution_history", json!({"limit": 10})).await;
        if res.is_error != Some(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the time a server judges leases again after a reconnection (5 s + the lease),
    // and a renewal more.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rows = ok(&ca, "get_execution_history", json!({"limit": 10})).await;
    for (_, run) in &held {
        let row = rows["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == run.as_str())
            .unwrap_or_else(|| panic!("{rows}"))
            .clone();
        // Still running (a loaded machine may have let it finish: never marked, all the same).
        assert!(
            matches!(row["status"].as_str(), Some("running" | "succeeded")),
            "after the outage: {row}"
        );
    }
    // Each session, through the other server.
    for ((sid, _), other) in held.iter().zip([&cb, &ca]) {
        let r = ok(
            other,
            "run_code",
            json!({"language": "python", "session_id": sid, "code": "print('still open')"}),
        )
        .await;
        assert_eq!(r["stdout"], "still open\n", "{r}");
    }
    for ((_, run), other) in held.iter().zip([&cb, &ca]) {
        let r = ok(
            other,
            "get_result",
            json!({"run_id": run, "wait_seconds": 60}),
        )
        .await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some("through\n")),
            "{r}"
        );
    }
    drop((ca, cb));
    stop_all([&mut a, &mut b]).await;
    for (_, run) in &held {
        assert!(leftovers(run).is_empty());
    }
}
