//! The shared queue itself (SPEC section 15), on a throwaway PostgreSQL without Docker or
//! servers: claims follow the database's order within the room a server has; a dead
//! server's unstarted claims go back to the queue once; a run sent to a server with room
//! waits behind an older one that fits.

use std::time::Duration;

use serde_json::json;

use crate::mcp_support::eventually;
use crate::pg_cluster::PgCluster;

fn store_of(url: &str) -> codebox::config::HistoryStore {
    codebox::config::HistoryStore::Postgres {
        url: url.to_string(),
        password_file: None,
    }
}

/// A run for the queue, submitted by `instance`, taking one slot and `charge_mb`.
fn queued_run(instance: &str, i: usize, charge_mb: u64) -> codebox::history::Submitted {
    use codebox::report::{RunLimits, RunReport, Status};
    let run_id = format!("run-q{i:04}-{instance}");
    let limits = RunLimits {
        memory_mb: 256,
        timeout_seconds: 10.0,
        cpus: 1.0,
    };
    let base = RunReport::new(&run_id, "python", Status::Queued, limits, "queued");
    codebox::history::Submitted {
        row: codebox::history::NewRun::new(
            &run_id,
            "python",
            limits,
            &format!("print({i})"),
            codebox::config::CodePolicy::Preview,
            instance,
        ),
        request: json!({"language": "python", "code": format!("print({i})")}).to_string(),
        base: serde_json::to_string(&base).unwrap(),
        slots: 1,
        charge_mb,
        claim_here: false,
    }
}

/// `queue.submit(run)`, tried again while the queue's thread is still making the table (the
/// first submit of a test may come before it): whether it was claimed here at once.
async fn submit_when_ready(
    queue: &codebox::history::SharedQueue,
    run: &codebox::history::Submitted,
) -> bool {
    let mut tries = 0;
    loop {
        match queue.submit(run.clone()).await {
            Ok(claimed) => return claimed,
            Err(e) => {
                tries += 1;
                assert!(tries < 50, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn room(slots: usize, memory_mb: u64) -> codebox::history::Room {
    codebox::history::Room {
        slots,
        memory_mb,
        max_slots: 4,
        budget_mb: 4096,
    }
}

/// `(claimed_by, handed_back)` of each queue row, by run id.
fn queue_rows(
    pg: &PgCluster,
    db: &str,
) -> std::collections::BTreeMap<String, (Option<String>, i64)> {
    pg.with_client(db, |c| {
        c.query("SELECT run_id, claimed_by, handed_back FROM queue", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    })
}

/// Claims in submission order within the room; a head too big for the room holds back what
/// follows (as one server's queue does), one too big for the server ever is left to others;
/// a queued run is withdrawn by any server; a dead server's unstarted claims go back to the
/// queue exactly once, whoever judges, and its runs' rows are not failed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_queue_claims_in_order_and_gives_a_dead_servers_claims_back_once() {
    use codebox::history::{History, Owner, SharedQueue};
    let pg = PgCluster::start();
    let url = pg.create_database("queue");
    let store = store_of(&url);
    let qa = SharedQueue::connect(&store, "qa").expect("a queue for PostgreSQL");
    let qb = SharedQueue::connect(&store, "qb").unwrap();
    let qc = SharedQueue::connect(&store, "qc").unwrap();
    // C is alive: it renews a lease (B never does). A long one: C judges others' leases at
    // each renewal (every third of its lease), and must not hand B's claim back before the
    // judges below are meant to, as it did on a loaded machine with the default 10 s.
    let c_dir = tempfile::tempdir().unwrap();
    let hc = History::connect(
        &store,
        Owner {
            instance: "qc".into(),
            data_dir: c_dir.path().to_path_buf(),
            lease: Duration::from_secs(300),
            ..Default::default()
        },
    );
    let sqlite = codebox::config::HistoryStore::Sqlite("/nonexistent/h.db".into());
    assert!(
        SharedQueue::connect(&sqlite, "x").is_none(),
        "SQLite has no shared queue"
    );
    let ids: Vec<String> = (0..6)
        .map(|i| {
            queued_run("qa", i, if i == 2 { 9000 } else { 300 })
                .row
                .run_id
        })
        .collect();
    for i in 0..6 {
        let run = queued_run("qa", i, if i == 2 { 9000 } else { 300 });
        submit_when_ready(&qa, &run).await;
    }
    // B has room for one run of 300 MB: the first in order.
    let got = qb.claim(room(1, 400)).await.unwrap();
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&ids[0]]);
    // C: room for 3, but only 500 MB: run 1 fits, then run 2 (9000 MB) can never fit a
    // 4096 MB budget and is skipped; run 3 does not fit the 200 MB left, and holds back 4.
    let got = qc.claim(room(3, 500)).await.unwrap();
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&ids[1]]);
    let rows = queue_rows(&pg, "queue");
    assert_eq!(rows[&ids[0]].0.as_deref(), Some("qb"));
    assert_eq!(rows[&ids[2]].0, None);
    // The history row follows its claimer (whom the others forward to).
    let owner: String = pg.with_client("queue", |c| {
        c.query_one("SELECT instance FROM runs WHERE id = $1", &[&ids[0]])
            .unwrap()
            .get(0)
    });
    assert_eq!(owner, "qb");
    // Any server takes an unclaimed run out; a claimed one is not its to take.
    let stopped = qc
        .withdraw(
            &ids[3],
            "stopped while waiting in the queue; it never started",
        )
        .await
        .unwrap()
        .expect("withdrawn");
    assert_eq!(stopped.status, codebox::report::Status::Stopped);
    assert!(qc.withdraw(&ids[0], "x").await.unwrap().is_none());
    assert!(
        qc.withdraw(&ids[3], "x").await.unwrap().is_none(),
        "only once"
    );
    let status: String = pg.with_client("queue", |c| {
        c.query_one("SELECT status FROM runs WHERE id = $1", &[&ids[3]])
            .unwrap()
            .get(0)
    });
    assert_eq!(status, "stopped");
    // C starts its run: it leaves the queue.
    qc.settle(&ids[1]);
    eventually(10, "a started run leaves the queue", || {
        !queue_rows(&pg, "queue").contains_key(&ids[1])
    })
    .await;

    // B dies (it never renews a lease). Two judges with a 1 s lease: B's claim goes back once,
    // its run is queued again, not failed.
    let judges: Vec<(History, tempfile::TempDir)> = ["judge1", "judge2"]
        .iter()
        .map(|name| {
            let dir = tempfile::tempdir().unwrap();
            let h = History::connect(
                &store,
                Owner {
                    instance: name.to_string(),
                    data_dir: dir.path().to_path_buf(),
                    lease: Duration::from_secs(1),
                    advertise_url: None,
                },
            );
            (h, dir)
        })
        .collect();
    eventually(30, "B's claim is back in the queue", || {
        queue_rows(&pg, "queue")[&ids[0]].0.is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rows = queue_rows(&pg, "queue");
    assert_eq!(rows[&ids[0]], (None, 1), "given back exactly once");
    let (status, instance): (String, String) = pg.with_client("queue", |c| {
        let r = c
            .query_one(
                "SELECT status, instance FROM runs WHERE id = $1",
                &[&ids[0]],
            )
            .unwrap();
        (r.get(0), r.get(1))
    });
    assert_eq!(status, "queued", "a run given back is not failed");
    assert_eq!(instance, "qb");
    // The next claim takes it first, in order.
    let got = qc.claim(room(2, 700)).await.unwrap();
    assert_eq!(
        got.iter().map(|c| &c.run_id).collect::<Vec<_>>(),
        [&ids[0], &ids[4]]
    );
    // Handing back is this server's own claims only.
    assert_eq!(qb.hand_back(vec![ids[4].clone()]).await.unwrap(), 0);
    assert_eq!(qc.hand_back(vec![ids[4].clone()]).await.unwrap(), 1);
    for (h, _) in &judges {
        h.flush(Duration::from_secs(5)).await;
    }
    hc.flush(Duration::from_secs(5)).await;
}

/// A run submitted to a server with room is claimed there at once, unless an older run that
/// it could take as well waits unclaimed: then it waits behind that one, which the server's
/// claimer takes first. So the order is the database's, whichever server a run was sent to
/// (what a cluster test's set-up met under load: a run sent to B a moment later reached the
/// database first, and A ran it before its own second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_sent_to_a_server_with_room_waits_behind_an_older_one_that_fits() {
    use codebox::history::SharedQueue;
    let pg = PgCluster::start();
    let url = pg.create_database("arrival");
    let store = store_of(&url);
    let qa = SharedQueue::connect(&store, "qa").expect("a queue for PostgreSQL");
    let qb = SharedQueue::connect(&store, "qb").unwrap();
    // B has no room: its run waits unclaimed.
    let older = queued_run("qb", 0, 300);
    submit_when_ready(&qb, &older).await;
    // A has room, but the older run would fit it as well: A's run waits behind it.
    let newer = codebox::history::Submitted {
        claim_here: true,
        ..queued_run("qa", 1, 300)
    };
    assert!(
        !qa.submit(newer.clone()).await.unwrap(),
        "it jumped the older run"
    );
    // A run smaller than the older one (100 MB, where that one asks 300) is A's at once: room
    // that fits it need not fit the older run.
    let small = codebox::history::Submitted {
        claim_here: true,
        ..queued_run("qa", 2, 100)
    };
    assert!(qa.submit(small.clone()).await.unwrap());
    // A's claimer, with room for one, takes the older run first.
    let got = qa.claim(room(1, 4096)).await.unwrap();
    let (older, newer, small) = (older.row.run_id, newer.row.run_id, small.row.run_id);
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&older]);
    let rows = queue_rows(&pg, "arrival");
    assert_eq!(rows[&older].0.as_deref(), Some("qa"));
    assert_eq!(rows[&newer].0, None);
    assert_eq!(rows[&small].0.as_deref(), Some("qa"));
}
