//! Several servers as one (SPEC section 15) when a server only looked dead: real `codebox
//! serve` processes, one throwaway PostgreSQL history, one Docker daemon.
//! - a server paused (SIGSTOP) for longer than its lease, holding a running run, a run it
//!   claimed and had not started, a session with an execution, and a run waiting in the
//!   shared queue: the others take over; resumed (SIGCONT), it is fenced: no run runs twice,
//!   every run has one final report and one history row, its late reports are dropped, it
//!   stops what the others ended and re-joins with a fresh lease;
//! - progress notifications of a `run_code` forwarded to a session's server reach the caller
//!   through the server it called.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{
    call, final_report, known, ok, ran_on, servers, start, start_args, start_cluster, tool_error,
    Client, TestCluster,
};
use crate::common::labelled_objects;
use crate::mcp_support::{eventually, text, TOKEN};
use crate::serve_child::ServeChild;

/// How many containers Docker created for `run_id` since `since` (Unix seconds): a run whose
/// code ran twice has two.
fn containers_created(run_id: &str, since: u64) -> usize {
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 1;
    let out = std::process::Command::new("docker")
        .args([
            "events",
            "--since",
            &since.to_string(),
            "--until",
            &until.to_string(),
            "--filter",
            "type=container",
            "--filter",
            "event=create",
            "--filter",
            &format!("label=codebox.run={run_id}"),
            "--format",
            "{{.Actor.ID}}",
        ])
        .output()
        .expect("docker events");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Hold a row lock on `run_id`'s history row (`SELECT ... FOR UPDATE` in an open transaction)
/// until the returned sender is dropped or sent to: a server claiming the run waits on it in
/// the middle of its claim.
fn hold_run_row(
    url: String,
    run_id: String,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let (locked, is_locked) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        let mut c = postgres::Client::connect(&url, postgres::NoTls).expect("connect");
        let mut tx = c.transaction().unwrap();
        let n = tx
            .query("SELECT id FROM runs WHERE id = $1 FOR UPDATE", &[&run_id])
            .unwrap()
            .len();
        let queued = tx
            .query(
                "SELECT claimed_by IS NULL FROM queue WHERE run_id = $1",
                &[&run_id],
            )
            .unwrap();
        // Where every run stands, for a failure's message.
        let runs: Vec<String> = tx
            .query(
                "SELECT id || ' ' || status || ' on ' || instance || ': ' || COALESCE(message, '') FROM runs ORDER BY created_at",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert!(
            queued.first().is_some_and(|r| r.get::<_, bool>(0)),
            "the run {run_id} waits in the shared queue, claimed by no server yet: {} queue rows; runs: {runs:#?}",
            queued.len()
        );
        locked.send(n).unwrap();
        let _ = released.recv();
        tx.rollback().unwrap();
    });
    assert_eq!(is_locked.recv().unwrap(), 1, "the run's row exists");
    (release, holder)
}

/// Wait until a server's claim from the shared queue waits on a run's row lock
/// ([`hold_run_row`]) in the middle of its claim.
async fn claim_waits_on_the_row(pg: &crate::pg_cluster::PgCluster, db: &'static str) {
    // Each waiting query, and what the sessions blocking it are doing.
    let waiters = || -> Vec<String> {
        pg.with_client(db, |c| {
            c.query(
                "SELECT a.query || ' <- ' || COALESCE((SELECT string_agg(b.state || ': ' || b.query, ' | ')
                     FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid))), '')
                 FROM pg_stat_activity a WHERE a.wait_event_type = 'Lock'",
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
        })
    };
    let claiming = |w: &[String]| w.iter().any(|q| q.starts_with("UPDATE runs SET instance"));
    let mut waiting = Vec::new();
    for _ in 0..600 {
        waiting = waiters();
        if claiming(&waiting) {
            return;
        }
        if !waiting.is_empty() {
            eprintln!("waiting on a lock: {waiting:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no claim waits on the run's row: {waiting:?}");
}

/// While a server's claim from the shared queue is on its way (held mid-claim by the claimed
/// run's row lock), a run submitted to it does not count on the room the claim may fill: it
/// waits in the shared queue, and the claimed run gets the slot. Before, both counted on the
/// one free slot, and the claimed run waited on a server with no room (on a loaded CI host the
/// partition test's set-up lost its queued run so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_its_way_keeps_the_room_it_may_fill() {
    let a_set: &[&str] = &["runs.max_concurrent_runs=2", "sessions.ready={}"];
    let b_set: &[&str] = &["runs.max_concurrent_runs=1", "sessions.ready={}"];
    let (cluster, mut a, mut b) = two_servers("claiming", a_set, b_set).await;
    let pg = &cluster.pg;
    let instance_a = a.instance().await;
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    let queue_row = |run_id: &str| -> Option<Option<String>> {
        pg.with_client("claiming", |c| {
            c.query("SELECT claimed_by FROM queue WHERE run_id = $1", &[&run_id])
                .unwrap()
                .first()
                .map(|r| r.get(0))
        })
    };
    // B full; A full with two runs.
    let b_long = start_args(&cb, long_run()).await;
    let a_long = start_args(&ca, long_run()).await;
    let a_freed = start_args(&ca, long_run()).await;
    for (client, id) in [(&cb, &b_long), (&ca, &a_long), (&ca, &a_freed)] {
        until_running(client, id).await;
    }
    // One run waits in the shared queue; A's claim of it is held mid-claim.
    let claimed = start_args(&cb, long_run()).await;
    known(&cb, &claimed).await;
    let (release, holder) = hold_run_row(pg.url("claiming"), claimed.clone());
    let stopped = ok(&ca, "stop_run", json!({"run_id": a_freed})).await;
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    claim_waits_on_the_row(pg, "claiming").await;
    // Submitted to A meanwhile: its one free slot is the claim's.
    let later = start(&ca, "print('later')").await;
    release.send(()).unwrap();
    holder.join().unwrap();
    until_running(&ca, &claimed).await;
    known(&ca, &later).await;
    assert_eq!(
        queue_row(&later),
        Some(None),
        "the run submitted to A during its claim waits in the shared queue, claimed by no server (A is {instance_a})"
    );
    // Room again: B runs it.
    ok(&cb, "stop_run", json!({"run_id": b_long})).await;
    let r = final_report(&cb, &later).await;
    assert_eq!(r["stdout"], "later\n", "{r}");
    for id in [&a_long, &claimed] {
        ok(&ca, "stop_run", json!({"run_id": id})).await;
    }
    drop((ca, cb));
    a.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// SIGSTOP or SIGCONT to a server this test started.
fn signal(server: &ServeChild, sig: i32) {
    // SAFETY: plain kill(2) on our own child's PID.
    assert_eq!(unsafe { libc::kill(server.pid(), sig) }, 0);
}

/// `call`, failed if it is still waiting after two minutes (forty leases): it would wait for
/// ever otherwise.
async fn guard<T>(call: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(120), call)
        .await
        .expect("still waiting after 120 s")
}

/// A tool's structured result, or its error text as `{"error": ...}`.
fn answer(res: rmcp::model::CallToolResult) -> Value {
    if res.is_error == Some(true) {
        return json!({"error": text(&res)});
    }
    res.structured_content.unwrap_or_default()
}

/// A run that goes on until something ends it.
const LONG: &str = "import time\ntime.sleep(3000)";
/// Its time limit, above any set-up's.
const LONG_LIMIT: u32 = 3500;

fn long_run() -> Value {
    json!({"language": "python", "code": LONG, "limits": {"timeout_seconds": LONG_LIMIT}})
}

async fn status(client: &Client, run_id: &str) -> Value {
    answer(call(client, "get_result", json!({"run_id": run_id})).await)
}

/// Wait (up to 30 s) until `client`'s server reports run `run_id` running.
async fn until_running(client: &Client, run_id: &str) {
    for _ in 0..600 {
        if status(client, run_id).await["status"] == "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        status(client, run_id).await["status"],
        "running",
        "{run_id}"
    );
}

/// A cluster of two servers on database `db`, with these settings each: the cluster (its
/// database and secret, kept for the test's length) and its two servers.
async fn two_servers(db: &str, a: &[&str], b: &[&str]) -> (TestCluster, ServeChild, ServeChild) {
    let mut cluster = start_cluster(db, &[a, b]).await;
    let [a, b] = servers(std::mem::take(&mut cluster.nodes));
    (cluster, a, b)
}

/// A (2 slots) is paused past its lease holding: a running run, a session execution, a run it
/// claimed that waits for its slot (made so deterministically by holding the run's row lock
/// while A claims it, and filling A's free slot with the session's execution meanwhile), and
/// a run waiting unclaimed in the shared queue. B takes over; A resumes; then every run has
/// one final report and one history row, none ran twice, A's late reports are dropped, A
/// ended what B ended and serves again under a fresh lease, and nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_is_fenced_nothing_runs_twice_and_it_rejoins() {
    let t0 = Instant::now();
    let since = unix_now().saturating_sub(1);
    // No session opened ahead of time: every container of A's is one of the test's.
    let a_set: &[&str] = &[
        "runs.max_concurrent_runs=2",
        "cluster.lease_seconds=3",
        "sessions.ready={}",
    ];
    let b_set: &[&str] = &[
        "runs.max_concurrent_runs=1",
        "cluster.lease_seconds=3",
        "sessions.ready={}",
    ];
    let (cluster, mut a, mut b) = two_servers("fence", a_set, b_set).await;
    let pg = &cluster.pg;
    let instance_a = a.instance().await;
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    let db_url = pg.url("fence");
    let count = |sql: &'static str| -> i64 {
        pg.with_client("fence", |c| c.query_one(sql, &[]).unwrap().get(0))
    };

    // B busy until the test stops its run once A is paused: what waits in the shared queue
    // waits for A, or for B then. No run here ends by itself before the test ends it: a run
    // that slept a fixed time let a slow set-up (32 s seen, after a fresh dockerd) outlast it.
    let b_long = start_args(&cb, long_run()).await;
    eventually(60, "B's run is running", || {
        !crate::common::leftovers(&b_long).is_empty()
    })
    .await;
    let info = ok(&ca, "create_session", json!({"language": "python"})).await;
    let sid = info["session_id"].as_str().unwrap().to_string();
    // A's two slots: one long run (A's own) and one the test stops to free a slot.
    let a_run = start_args(&ca, long_run()).await;
    let a_short = start(&ca, "import time\ntime.sleep(600)").await;
    // Both of A's slots taken before the run A will claim is sent: a run A still holds queued
    // left it room to claim, and start, that run in a CI run.
    for id in [&a_run, &a_short] {
        until_running(&ca, id).await;
    }
    // The run A will claim: sent to B, which has no room, so it waits in the shared queue.
    let claimed = start(&cb, "print('claimed once')").await;
    known(&cb, &claimed).await;
    let (release, holder) = hold_run_row(db_url.clone(), claimed.clone());
    // When the second run is stopped, A claims it, and waits on the row lock mid-claim.
    let stopped = ok(&ca, "stop_run", json!({"run_id": a_short})).await;
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    claim_waits_on_the_row(pg, "fence").await;
    // Meanwhile the session's execution takes A's free slot; then A's claim goes through
    // and the claimed run waits on A for a slot.
    let exec = ok(
        &ca,
        "start_run",
        json!({"language": "python", "session_id": sid, "code": LONG,
               "limits": {"timeout_seconds": LONG_LIMIT}}),
    )
    .await["run_id"]
        .as_str()
        .unwrap()
        .to_string();
    until_running(&ca, &exec).await;
    release.send(()).unwrap();
    holder.join().unwrap();
    eventually(30, "A holds the claim, not started", || {
        count("SELECT COUNT(*) FROM queue WHERE claimed_by IS NOT NULL") == 1
    })
    .await;
    let (claimer, run_status): (String, String) = pg.with_client("fence", |c| {
        let r = c
            .query_one(
                "SELECT q.claimed_by, r.status FROM queue q JOIN runs r ON r.id = q.run_id",
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    });
    assert_eq!(
        (claimer.as_str(), run_status.as_str()),
        (instance_a.as_str(), "queued")
    );
    // And one waiting unclaimed in the shared queue, sent to A.
    let waiting = start(&ca, "print('waited once')").await;
    known(&ca, &waiting).await;
    assert_eq!(status(&cb, &waiting).await["status"], "queued");
    drop(ca);
    eprintln!(
        "set-up with A holding each kind of run: {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // Paused past its lease: B marks what A ran, ends its session, takes over the rest.
    signal(&a, libc::SIGSTOP);
    let paused = Instant::now();
    // Calls B forwards to A at once (A's lease has not lapsed yet) are answered by B once the
    // lease lapses and what A held is settled: they waited 90 s for an error, or for ever.
    let http = reqwest::Client::new();
    let (by_mcp, by_v1, stop_exec, read) = tokio::join!(
        guard(call(
            &cb,
            "get_result",
            json!({"run_id": a_run, "wait_seconds": 60})
        )),
        guard(async {
            let r = http
                .get(b.http_url(&format!("/v1/runs/{a_run}?wait_seconds=60")))
                .bearer_auth(TOKEN)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or_default(),
            )
        }),
        guard(call(&cb, "stop_run", json!({"run_id": exec}))),
        guard(call(
            &cb,
            "read_session_file",
            json!({"session_id": sid, "path": "x"})
        )),
    );
    let by_mcp = answer(by_mcp);
    assert_eq!(
        (by_mcp["status"].as_str(), by_mcp["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "get_result on B: {by_mcp}"
    );
    assert_eq!(
        (by_v1.0, by_v1.1["status"].as_str()),
        (200, Some("sandbox_error")),
        "GET /v1/runs on B: {:?}",
        by_v1
    );
    let stop_exec = answer(stop_exec);
    assert_eq!(
        stop_exec["status"], "sandbox_error",
        "stop_run on B: {stop_exec}"
    );
    assert_eq!(read.is_error, Some(true), "{read:?}");
    assert!(
        text(&read).contains("the server that held it stopped"),
        "read_session_file on B: {}",
        text(&read)
    );
    let mut last = Value::Null;
    for _ in 0..600 {
        last = status(&cb, &a_run).await;
        if last["status"] == "sandbox_error" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (last["status"].as_str(), last["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{last}"
    );
    // B's slot freed: it runs what A had claimed and what waited.
    let b_stopped = ok(&cb, "stop_run", json!({"run_id": b_long})).await;
    assert_eq!(b_stopped["status"], "stopped", "{b_stopped}");
    for (id, out) in [(&claimed, "claimed once\n"), (&waiting, "waited once\n")] {
        let r = final_report(&cb, id).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(out)),
            "{r}"
        );
    }
    let ended = tool_error(
        &cb,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(1)"}),
    )
    .await;
    assert!(ended.contains("the server that held it stopped"), "{ended}");
    let judged = paused.elapsed();

    // Resumed: A finds its lease judged lapsed, stops what B ended, and re-joins.
    signal(&a, libc::SIGCONT);
    let resumed = Instant::now();
    let ca = a.client(TOKEN).await;
    // Everything A held is over there too: nothing of it is active.
    let mut health = Value::Null;
    for _ in 0..600 {
        health = http
            .get(a.http_url("/healthz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if health["active"] == 0 && health["queued"] == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (health["active"].as_i64(), health["queued"].as_i64()),
        (Some(0), Some(0)),
        "{health}"
    );
    let stopped_after = resumed.elapsed();
    // Every run: one history row, one final report (the first written), code run once.
    let ids = [&b_long, &a_run, &a_short, &claimed, &exec, &waiting]
        .map(|s| s.to_string())
        .to_vec();
    let mut rows = ran_on(&cb, &ids).await;
    for _ in 0..100 {
        if rows.iter().all(|(_, s)| s != "queued" && s != "running") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        rows = ran_on(&cb, &ids).await;
    }
    let statuses: Vec<&str> = rows.iter().map(|(_, s)| s.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "stopped",
            "sandbox_error",
            "stopped",
            "succeeded",
            "sandbox_error",
            "succeeded"
        ],
        "{rows:?}"
    );
    let a_row = ok(&cb, "get_execution_history", json!({"limit": 100})).await;
    let a_row = a_row["runs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == a_run.as_str())
        .cloned()
        .unwrap();
    assert_eq!(a_row["message"], "its server stopped answering", "{a_row}");
    // A run takes a ready container from the pool (which follows demand) or makes its own,
    // labelled with it: never two.
    for id in [&b_long, &a_run, &a_short, &claimed, &waiting] {
        let made = containers_created(id, since);
        assert!(made <= 1, "run {id}: {made} containers made for it");
    }
    // A answers as B did: its run's report is B's, its session ended with the reason.
    let r = final_report(&ca, &a_run).await;
    assert_eq!(
        (r["status"].as_str(), r["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{r}"
    );
    let ended = tool_error(
        &ca,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(1)"}),
    )
    .await;
    assert!(ended.contains("the server that held it stopped"), "{ended}");
    // It serves again, under its fresh lease.
    eventually(60, "A re-joins with a fresh lease", || {
        count("SELECT COUNT(*) FROM instances WHERE lapsed_at IS NOT NULL") == 0
    })
    .await;
    let again = ok(
        &ca,
        "run_code",
        json!({"language": "python", "code": "print('again')"}),
    )
    .await;
    assert_eq!(again["stdout"], "again\n", "{again}");

    assert_eq!(
        count("SELECT COUNT(*) FROM queue"),
        0,
        "the shared queue is empty"
    );
    // Nothing of A's is left: its runs' containers and its session's went when it stopped them.
    let instance_filter = format!("label=codebox.instance={instance_a}");
    let mut left = labelled_objects(&instance_filter);
    for _ in 0..600 {
        if left.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        left = labelled_objects(&instance_filter);
    }
    if !left.is_empty() {
        let ps = std::process::Command::new("docker")
            .args([
                "ps",
                "-a",
                "--filter",
                &instance_filter,
                "--format",
                "{{.ID}} {{.Status}} {{.Label \"codebox.run\"}}",
            ])
            .output()
            .unwrap();
        panic!(
            "A's containers are left: {left:?}\n{}\n{}",
            String::from_utf8_lossy(&ps.stdout),
            a.stderr_report().1
        );
    }
    let (panics, tail) = a.stderr_report();
    assert!(panics.is_empty(), "{panics:?}");
    eprintln!(
        "lease 3 s: B marked A's run {:.1} s after the pause; A stopped what B ended {:.1} s after it resumed; whole test {:.1} s\n{tail}",
        judged.as_secs_f64(),
        stopped_after.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop((ca, cb));
    a.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
}

/// An MCP client over HTTP that records the progress notifications it gets.
async fn progress_client(
    server: &ServeChild,
) -> rmcp::service::RunningService<rmcp::RoleClient, crate::mcp_support::Client> {
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::ServiceExt;
    let t = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(server.http_url("/mcp")).auth_header(TOKEN),
    );
    crate::mcp_support::Client::default()
        .serve(t)
        .await
        .expect("MCP over HTTP")
}

/// What a progress notification says, without the numbers that depend on timing: its total,
/// and its message with the seconds taken out.
fn shape(p: &rmcp::model::ProgressNotificationParam) -> (Option<f64>, String) {
    let m = p.message.clone().unwrap_or_default();
    let m = match m.split_once(" s") {
        Some((head, tail)) if head.starts_with("running for ") => format!("running for N s{tail}"),
        _ => m,
    };
    (p.total, m)
}

/// `run_code` in a session A holds, called on B: B forwards it to A, and A's progress
/// notifications (the newest output included) reach B's client as A's own client gets them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_of_a_forwarded_run_code_reaches_the_caller() {
    let (_cluster, mut a, mut b) = two_servers("progress", &[], &[]).await;
    let (ca, cb) = (progress_client(&a).await, progress_client(&b).await);
    let sid = crate::mcp_support::ok(&ca, "create_session", json!({"language": "python"})).await
        ["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let code = "import time\nfor i in range(9):\n    print(f'line {i}', flush=True)\n    time.sleep(1/3)\n";
    let args = json!({"language": "python", "session_id": sid, "code": code});
    let direct = crate::mcp_support::ok(&ca, "run_code", args.clone()).await;
    let forwarded = crate::mcp_support::ok(&cb, "run_code", args).await;
    for r in [&direct, &forwarded] {
        assert_eq!(r["status"], "succeeded", "{r}");
        assert!(r["stdout"].as_str().unwrap().contains("line 8"), "{r}");
    }
    let seen_a = ca.service().progress.lock().unwrap().clone();
    let seen_b = cb.service().progress.lock().unwrap().clone();
    for seen in [&seen_a, &seen_b] {
        assert!(seen.len() >= 2, "progress notifications: {seen:?}");
        for pair in seen.windows(2) {
            assert!(pair[1].progress > pair[0].progress, "{seen:?}");
        }
        assert!(
            seen.iter().any(|p| {
                let m = p.message.as_deref().unwrap_or("");
                m.contains("newest output:\nline ")
            }),
            "{seen:?}"
        );
    }
    // The same notifications, whichever server the client called (their seconds aside).
    let running = |seen: &[rmcp::model::ProgressNotificationParam]| -> Vec<(Option<f64>, String)> {
        seen.iter()
            .map(shape)
            .filter(|(_, m)| m.starts_with("running for N s"))
            .map(|(t, m)| (t, m.split("\n").next().unwrap().to_string()))
            .collect()
    };
    let (ra, rb) = (running(&seen_a), running(&seen_b));
    assert!(!rb.is_empty(), "{seen_b:?}");
    assert_eq!(ra[0].0, rb[0].0, "the same total: {seen_a:?} / {seen_b:?}");
    assert_eq!(ra[0].1, rb[0].1, "{seen_a:?} / {seen_b:?}");
    eprintln!(
        "progress of one run_code of 3 s: {} notifications direct, {} through another server",
        seen_a.len(),
        seen_b.len()
    );
    // Cancelling the forwarded call with progress stops the execution on A.
    let before = cb.service().progress.lock().unwrap().len();
    let request = rmcp::model::ClientRequest::CallToolRequest(rmcp::model::Request::new(
        crate::mcp_support::params(
            "run_code",
            json!({"language": "python", "session_id": sid, "code": "import time\nprint('started', flush=True)\ntime.sleep(60)"}),
        ),
    ));
    let handle = cb
        .send_cancellable_request(request, rmcp::service::PeerRequestOptions::no_options())
        .await
        .unwrap();
    for _ in 0..600 {
        if cb.service().progress.lock().unwrap().len() > before + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(cb.service().progress.lock().unwrap().len() > before + 1);
    handle
        .cancel(Some("user pressed stop".into()))
        .await
        .unwrap();
    let rows = crate::mcp_support::ok(
        &ca,
        "get_execution_history",
        json!({"session_id": sid, "limit": 1}),
    )
    .await;
    let last = rows["runs"][0]["run_id"].as_str().unwrap().to_string();
    let r = crate::mcp_support::ok(
        &ca,
        "get_result",
        json!({"run_id": last, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(r["status"], "stopped", "{r}");
    let closed = crate::mcp_support::ok(&cb, "close_session", json!({"session_id": sid})).await;
    assert_eq!(closed["closed"], true, "{closed}");
    drop((ca, cb));
    a.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
}
