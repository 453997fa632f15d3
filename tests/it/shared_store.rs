//! Several servers, one store: two real `codebox serve` processes over HTTP, one PostgreSQL
//! history (a throwaway cluster), one Docker daemon. Each has a data directory of its own, as
//! two hosts would: their lock files cannot see each other, so each judges the other by its
//! heartbeat in the database.

use std::time::Instant;

use rmcp::model::CallToolResult;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::{json, Value};

use crate::common::leftovers;
use crate::mcp_support::{eventually, params, text, TOKEN};
use crate::pg_cluster::PgCluster;
use crate::serve_child::{Options, ServeChild};

type Client = RunningService<RoleClient, ()>;

async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    client
        .call_tool(params(tool, args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"))
}

async fn ok(client: &Client, tool: &'static str, args: Value) -> Value {
    let res = call(client, tool, args.clone()).await;
    assert_ne!(res.is_error, Some(true), "{tool}({args}): {}", text(&res));
    res.structured_content.expect("structured content")
}

async fn history(client: &Client) -> Vec<Value> {
    ok(client, "get_execution_history", json!({"limit": 1000})).await["runs"]
        .as_array()
        .unwrap()
        .clone()
}

/// The same report, whichever server answered: the store keeps returned files without
/// their contents, and a run's own server may answer while its containers are going.
fn comparable(mut report: Value) -> Value {
    report.as_object_mut().unwrap().remove("files");
    report
}

async fn start(client: &Client, code: &str) -> String {
    ok(
        client,
        "start_run",
        json!({"language": "python", "code": code}),
    )
    .await["run_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `print(i)` in Python, to the end.
async fn print(client: &Client, i: usize) -> Value {
    let r = ok(
        client,
        "run_code",
        json!({"language": "python", "code": format!("print({i})")}),
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{r}");
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_history_record_answer_and_reap_only_for_the_dead() {
    let t0 = Instant::now();
    let pg = PgCluster::start();
    let url = pg.create_database("shared");
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let history_url = format!("history.url={url}");
    // Servers sharing a history over HTTP are a cluster (SPEC section 15): each says where
    // the others reach it, and all hold the same secret.
    let keys = tempfile::tempdir().unwrap();
    let secret = keys.path().join("cluster.secret");
    std::fs::write(&secret, "shared-store-test-secret-0123456789\n").unwrap();
    let secret_set = format!("cluster.secret_file={}", secret.display());
    let ports: Vec<u16> = (0..2).map(|_| crate::common::free_port()).collect();
    let listens: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let advertise: Vec<String> = listens
        .iter()
        .map(|l| format!("cluster.advertise_url=http://{l}"))
        .collect();
    let sets: Vec<[&str; 4]> = (0..2)
        .map(|i| {
            [
                history_url.as_str(),
                "pool.sizes={}",
                secret_set.as_str(),
                advertise[i].as_str(),
            ]
        })
        .collect();
    let serve = |dir, i: usize| {
        ServeChild::start_in(
            dir,
            Options {
                http_token: Some(TOKEN),
                sets: &sets[i],
                log: "info,bollard=warn",
                echo_stderr: true,
                listen: Some(&listens[i]),
            },
        )
    };
    let mut a = serve(dir_a, 0).await;
    let mut b = serve(dir_b, 1).await;
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // Both record: runs on each, at the same time.
    const EACH: usize = 6;
    let t = Instant::now();
    let (reports_a, reports_b) = tokio::join!(
        futures_util::future::join_all((0..EACH).map(|i| print(&ca, i))),
        futures_util::future::join_all((0..EACH).map(|i| print(&cb, 100 + i))),
    );
    let burst = t.elapsed();
    let ids = |rs: &[Value]| -> Vec<String> {
        rs.iter()
            .map(|r| r["run_id"].as_str().unwrap().to_string())
            .collect()
    };
    let (ids_a, ids_b) = (ids(&reports_a), ids(&reports_b));

    // get_execution_history on either shows every run, each with the instance that ran it.
    // Each server's history thread writes a run's end a moment after the server answered,
    // and answers its own queries after its own writes: one query on each is the barrier.
    history(&ca).await;
    history(&cb).await;
    let (rows_a, rows_b) = (history(&ca).await, history(&cb).await);
    assert_eq!(rows_a, rows_b, "one history, whichever server is asked");
    let instance_of = |id: &str| -> String {
        rows_a
            .iter()
            .find(|r| r["run_id"] == id)
            .unwrap_or_else(|| panic!("run {id} is not in the history"))["instance"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (instance_a, instance_b) = (a.instance().await, b.instance().await);
    assert_ne!(instance_a, instance_b);
    // One queue for both (SPEC section 15): each run ran on whichever server had room.
    assert!(ids_a.iter().chain(&ids_b).all(|id| {
        let by = instance_of(id);
        by == instance_a || by == instance_b
    }));

    // get_result on the server that did not run it answers from the store.
    let mut across = Vec::new();
    for (report, other) in reports_a
        .iter()
        .map(|r| (r, &cb))
        .chain(reports_b.iter().map(|r| (r, &ca)))
    {
        let t = Instant::now();
        let got = ok(other, "get_result", json!({"run_id": report["run_id"]})).await;
        across.push(t.elapsed());
        assert_eq!(comparable(got), comparable(report.clone()));
    }
    let mut own = Vec::new();
    for (report, client) in reports_a.iter().map(|r| (r, &ca)) {
        let t = Instant::now();
        ok(client, "get_result", json!({"run_id": report["run_id"]})).await;
        own.push(t.elapsed());
    }
    across.sort();
    own.sort();

    // A run server A holds: B forwards get_result to A while it runs (tests/it/cluster.rs
    // has the rest of forwarding), and answers once it ends.
    let slow = start(&ca, "import time\ntime.sleep(3)\nprint('slow')").await;
    // A's history thread records the run a moment after start_run answered.
    for _ in 0..100 {
        if history(&cb)
            .await
            .iter()
            .any(|r| r["run_id"] == slow.as_str())
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let now = ok(&cb, "get_result", json!({"run_id": slow})).await;
    assert!(
        matches!(now["status"].as_str(), Some("queued" | "running")),
        "A's report as it stands: {now}"
    );
    // A client that moves to B right after start_run on A, asking with wait_seconds, gets
    // the report: B looks again for an id it does not know yet, then for the end.
    let quick = start(&ca, "print('quick')").await;
    let r = ok(
        &cb,
        "get_result",
        json!({"run_id": quick, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(
        (r["status"].as_str(), r["stdout"].as_str()),
        (Some("succeeded"), Some("quick\n")),
        "{r}"
    );

    let t = Instant::now();
    let waited = ok(
        &cb,
        "get_result",
        json!({"run_id": slow, "wait_seconds": 30}),
    )
    .await;
    let waited_for = t.elapsed();
    assert_eq!(waited["status"], "succeeded", "{waited}");
    assert_eq!(waited["stdout"], "slow\n");

    // Each reaps only what dead instances left. A and B both run something long; B is
    // killed outright, and B's successor (same data directory) removes B's containers and
    // marks its run, but leaves A's, whose heartbeat is fresh.
    let kept = start(&ca, "import time\ntime.sleep(10)\nprint('survived')").await;
    let killed = start(&cb, "import time\ntime.sleep(600)").await;
    for id in [&kept, &killed] {
        eventually(60, "the run's containers exist", || {
            !leftovers(id).is_empty()
        })
        .await;
    }
    // B's history has the run (a query on B comes after B's own writes).
    assert!(history(&cb)
        .await
        .iter()
        .any(|r| r["run_id"] == killed.as_str()));
    drop(cb);
    b.signal_and_wait(libc::SIGKILL).await;
    let mut b2 = serve(b.into_data(), 1).await;
    let cb2 = b2.client(TOKEN).await;
    eventually(30, "the killed server's containers are removed", || {
        leftovers(&killed).is_empty()
    })
    .await;
    assert!(
        !leftovers(&kept).is_empty(),
        "the living server's run keeps its containers"
    );
    for client in [&ca, &cb2] {
        let r = ok(client, "get_result", json!({"run_id": killed})).await;
        // B's successor (same data directory) marks it at once; A would after B's lease.
        assert_eq!(r["status"], "sandbox_error", "{r}");
        assert!(
            matches!(
                r["message"].as_str(),
                Some("interrupted by server restart" | "its server stopped answering")
            ),
            "{r}"
        );
    }
    let r = ok(
        &ca,
        "get_result",
        json!({"run_id": kept, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(
        (r["status"].as_str(), r["stdout"].as_str()),
        (Some("succeeded"), Some("survived\n")),
        "{r}"
    );
    // A's history thread writes the end a moment after A answered: B2 waits for it.
    let r = ok(
        &cb2,
        "get_result",
        json!({"run_id": kept, "wait_seconds": 10}),
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{r}");

    let rows = history(&cb2).await;
    let count = |instance: &str| rows.iter().filter(|r| r["instance"] == instance).count();
    eprintln!(
        "two servers, one PostgreSQL history: {EACH} + {EACH} python runs at once in {:.1} s; \
         recorded by a: {}, by b: {}, {} runs in all; get_result across servers \
         (from the store): median {:.1} ms, max {:.1} ms; on the run's own server (memory): \
         median {:.1} ms; get_result(wait_seconds) for a run the other server held: answered \
         {:.2} s after the call; whole test {:.1} s",
        burst.as_secs_f64(),
        count(&instance_a),
        count(&instance_b),
        rows.len(),
        across[across.len() / 2].as_secs_f64() * 1e3,
        across.last().unwrap().as_secs_f64() * 1e3,
        own[own.len() / 2].as_secs_f64() * 1e3,
        waited_for.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
    );
    assert_eq!(count(&instance_a) + count(&instance_b), 2 * EACH + 4);

    drop((ca, cb2));
    a.signal_and_wait(libc::SIGTERM).await;
    b2.signal_and_wait(libc::SIGTERM).await;
    for id in ids_a
        .iter()
        .chain(&ids_b)
        .chain([&slow, &quick, &kept, &killed])
    {
        assert!(leftovers(id).is_empty(), "run {id} left containers");
    }
}
