//! One queue for all (SPEC section 15), on real servers, each on a Docker host of its own:
//! runs sent to a busy server are run by the others, on their own hosts; a server killed
//! with every slot busy loses its running run (`sandbox_error`) but not the runs that waited
//! for it in the shared queue, which run on the others, each reported once.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{
    final_report, left_on_hosts, left_only_on, ok, on_hosts, private_hosts, ran_on, reaped,
    running_on, start_cluster_on, start_lang, stop_all, until_sandbox_error, watch,
};
use crate::mcp_support::{eventually, TOKEN};

/// One queue for all (SPEC section 15), on real servers, each on a Docker host of its own:
/// 12 runs sent to a server with one slot are run by the others too, on their hosts; then, with every slot busy, a server killed
/// outright: its running run is `sandbox_error`, the runs sent to it that waited in the
/// shared queue run on the others, each reported once; nothing is left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_servers_runs_go_to_the_others_and_a_killed_ones_queue_is_not_lost() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let watch = watch(hosts);
    let one: &[&str] = &["runs.max_concurrent_runs=1", "cluster.lease_seconds=3"];
    let two: &[&str] = &["runs.max_concurrent_runs=2", "cluster.lease_seconds=3"];
    let mut cluster = start_cluster_on("busy", &[one, two, two], hosts).await;
    let [mut a, mut b, mut c] = cluster.servers();
    let names = [a.instance().await, b.instance().await, c.instance().await];
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // 12 runs to A, which has one slot.
    let t = Instant::now();
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(start_lang(&ca, "bash", &format!("sleep 1; echo {i}")).await);
    }
    for (i, id) in ids.iter().enumerate() {
        let r = final_report(&ca, id).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("{i}\n").as_str())),
            "{r}"
        );
    }
    let busy = t.elapsed();
    let spread = ran_on(&ca, &ids).await;
    let count = |name: &str| spread.iter().filter(|(i, _)| i == name).count();
    let counts = [count(&names[0]), count(&names[1]), count(&names[2])];
    assert_eq!(counts.iter().sum::<usize>(), 12, "{spread:?}");
    assert!(
        counts[1] > 0 && counts[2] > 0,
        "B and C ran some: {counts:?}"
    );
    // On their own hosts: each run's containers were made by its server's daemon only.
    let made_on = watch.hosts_of(&names, &ids);
    for (id, (instance, _)) in ids.iter().zip(&spread) {
        assert_eq!(instance, &names[made_on[id]], "run {id}");
    }
    eprintln!(
        "12 runs of 1 s sent to a server with 1 slot: {:.1} s, run by A/B/C {counts:?}",
        busy.as_secs_f64()
    );

    // Every slot busy: one long run on A (sent to A while it is idle: its own), then two
    // each on B and C (sent to B).
    let held = start_lang(&ca, "bash", "sleep 600").await;
    running_on(&hosts[0], &held, "A's long run is running on A's host").await;
    let mut long = Vec::new();
    for _ in 0..4 {
        long.push(start_lang(&cb, "bash", "sleep 15; echo long").await);
    }
    eventually(60, "the four long runs are running", || {
        long.iter().all(|id| !left_on_hosts(hosts, id).is_empty())
    })
    .await;
    // Six more to A: no server has room, they wait in the shared queue.
    let mut queued = Vec::new();
    for i in 0..6 {
        queued.push(start_lang(&ca, "bash", &format!("echo 'queued {i}'")).await);
    }
    for id in &queued {
        let r = ok(&cb, "get_result", json!({"run_id": id})).await;
        assert_eq!(r["status"], "queued", "{r}");
    }
    drop(ca);
    a.signal_and_wait(libc::SIGKILL).await;
    for (i, id) in queued.iter().enumerate() {
        let r = final_report(&cb, id).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("queued {i}\n").as_str())),
            "{r}"
        );
    }
    let last = until_sandbox_error(&cb, &held, |_| {}).await;
    assert_eq!(
        (last["status"].as_str(), last["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{last}"
    );
    for id in &long {
        assert_eq!(final_report(&cb, id).await["status"], "succeeded");
    }
    // The history row trails the answer by a moment (its server writes it after answering).
    let mut after = ran_on(&cb, &queued).await;
    for _ in 0..100 {
        if after.iter().all(|(_, s)| s == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = ran_on(&cb, &queued).await;
    }
    assert!(
        after
            .iter()
            .all(|(i, s)| i != &names[0] && s == "succeeded"),
        "{after:?}"
    );
    let left: i64 = cluster.pg.with_client("busy", |c| {
        c.query_one("SELECT COUNT(*) FROM queue", &[])
            .unwrap()
            .get(0)
    });
    assert_eq!(left, 0, "nothing is left in the shared queue");
    eprintln!("whole test {:.1} s", t0.elapsed().as_secs_f64());
    // The queued runs ran on B's and C's hosts.
    let made_on = watch.hosts_of(&names, &queued);
    assert!(queued.iter().all(|id| made_on[id] != 0), "{made_on:?}");
    drop(cb);
    // A's containers stay on A's host, and only there (B and C reap only what their own
    // daemons hold), until that host next gets a server on A's data directory.
    left_only_on(hosts, 0, &names[0]);
    let mut a2 = cluster.restart_on(a, one, &hosts[0]).await;
    reaped(&hosts[0], &names[0]).await;
    stop_all([&mut a2, &mut b, &mut c]).await;
    assert!(on_hosts(hosts, "label=codebox.managed=true").is_empty());
}
