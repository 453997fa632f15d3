//! The history in PostgreSQL, on a real throwaway cluster (`pg_cluster.rs`): the same schema
//! and migrations as SQLite, the same answers to the same runs, heartbeats judged by the
//! database's clock, and an outage that never fails a run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use codebox::config::{CodePolicy, HistoryStore};
use codebox::engine::fake::{exited, FakeEngine};
use codebox::history::{
    History, HistoryRow, NewRun, Owner, Query, INSTANCE_EXPIRY, SCHEMA_VERSION,
};
use codebox::report::{RunLimits, Status};
use codebox::runs::RunManager;

use crate::common::request;
use crate::mcp_support::{eventually, manager_on};
use crate::pg_cluster::PgCluster;

fn postgres(url: &str, instance: &str, data_dir: &std::path::Path) -> History {
    History::connect(
        &HistoryStore::Postgres {
            url: url.to_string(),
            password_file: None,
        },
        Owner {
            instance: instance.to_string(),
            data_dir: data_dir.to_path_buf(),
            ..Default::default()
        },
    )
}

/// `(column, type family, not null)` of a PostgreSQL table, in order.
fn pg_columns(client: &mut postgres::Client, table: &str) -> Vec<(String, String, bool)> {
    client
        .query(
            "SELECT column_name::text, data_type::text, is_nullable::text = 'NO'
             FROM information_schema.columns WHERE table_name = $1 ORDER BY ordinal_position",
            &[&table],
        )
        .unwrap()
        .iter()
        .map(|r| {
            let family = match r.get::<_, String>(1).as_str() {
                "bigint" => "INTEGER",
                "double precision" => "REAL",
                "text" => "TEXT",
                other => panic!("{table}: unexpected PostgreSQL type {other}"),
            };
            (r.get(0), family.to_string(), r.get(2))
        })
        .collect()
}

/// The same for SQLite, by affinity. A primary key counts as not null, as in PostgreSQL
/// (SQLite lets a `TEXT PRIMARY KEY` hold null; codebox never writes one).
fn sqlite_columns(conn: &rusqlite::Connection, table: &str) -> Vec<(String, String, bool)> {
    conn.prepare(&format!(
        "SELECT name, type, \"notnull\" OR pk > 0 FROM pragma_table_info('{table}')"
    ))
    .unwrap()
    .query_map([], |r| {
        let declared = r.get::<_, String>(1)?.to_ascii_uppercase();
        let family = if declared.contains("INT") {
            "INTEGER"
        } else if declared.contains("TEXT") {
            "TEXT"
        } else {
            "REAL"
        };
        Ok((r.get(0)?, family.to_string(), r.get(2)?))
    })
    .unwrap()
    .collect::<Result<_, _>>()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_gets_the_sqlite_schema_and_servers_starting_together_migrate_it_once() {
    let started = Instant::now();
    let pg = PgCluster::start();
    let url = pg.create_database("migrations");
    let dir = tempfile::tempdir().unwrap();
    // Three processes opening an empty database at the same moment.
    let histories: Vec<History> = (0..3)
        .map(|i| postgres(&url, &format!("i{i}"), dir.path()))
        .collect();
    for h in &histories {
        assert_eq!(h.query(Query::default()).await.unwrap(), Vec::new());
    }
    let (versions, instances, pg_tables) = pg.with_client("migrations", |c| {
        let versions: Vec<i64> = c
            .query("SELECT version FROM codebox_schema", &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        let instances: i64 = c
            .query_one("SELECT COUNT(*) FROM instances", &[])
            .unwrap()
            .get(0);
        let tables: Vec<_> = ["runs", "instances"]
            .iter()
            .map(|t| pg_columns(c, t))
            .collect();
        (versions, instances, tables)
    });
    assert_eq!(versions, [SCHEMA_VERSION]);
    assert_eq!(instances, 3, "each announced itself");

    let sqlite_path = dir.path().join("h.sqlite3");
    let sqlite = History::open(
        &sqlite_path,
        Owner {
            instance: "s".into(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        },
    );
    sqlite.query(Query::default()).await.unwrap();
    let conn = rusqlite::Connection::open(&sqlite_path).unwrap();
    for (table, pg_cols) in ["runs", "instances"].into_iter().zip(pg_tables) {
        let lite_cols = sqlite_columns(&conn, table);
        assert!(!pg_cols.is_empty(), "{table} exists in PostgreSQL");
        assert_eq!(
            pg_cols, lite_cols,
            "{table}: the same columns, types and NOT NULLs"
        );
    }
    eprintln!(
        "postgres migrations test: {:.1} s with cluster set-up",
        started.elapsed().as_secs_f64()
    );
}

/// Runs on the fake engine through a run manager recording into `history`: one succeeds, one
/// fails, one is stopped while queued. Returns the rows with what varies between runs blanked.
async fn record_three_runs(history: &History) -> Vec<HistoryRow> {
    let fake = Arc::new(FakeEngine::new());
    let m: RunManager = manager_on(
        fake.clone(),
        |c| c.runs.max_concurrent_runs = 1,
        Some(history.clone()),
    );
    fake.script(exited(0, "hello\n"));
    let ok = m.submit(request("bash", "echo hello")).unwrap();
    let ok_report = m.wait(&ok.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(ok_report.status, Status::Succeeded);
    fake.script(exited(3, "no\n"));
    let bad = m.submit(request("bash", "exit 3")).unwrap();
    m.wait(&bad.run_id, Duration::from_secs(10)).await.unwrap();
    fake.hang_on_start();
    let hanging = m.submit(request("bash", "sleep 1000")).unwrap();
    let queued = m.submit(request("bash", "echo never")).unwrap();
    eventually(10, "the hanging program's container is attached", || {
        fake.attached() == 3
    })
    .await;
    // Past attaching, the program is handed over within microseconds; stop it after that.
    tokio::time::sleep(Duration::from_millis(200)).await;
    m.stop(&queued.run_id).await.unwrap();
    m.stop(&hanging.run_id).await.unwrap();
    // The stored report is the final report, read back from the database.
    assert_eq!(
        history.report(&ok.run_id, None).await.unwrap(),
        Some(ok_report)
    );
    let rows = history.query(Query::default()).await.unwrap();
    assert_eq!(
        rows.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>(),
        [&queued.run_id, &hanging.run_id, &bad.run_id, &ok.run_id].map(|s| s.to_string()),
        "newest first"
    );
    let failed = history
        .query(Query {
            status: Some(Status::Failed),
            language: Some("bash".into()),
            limit: Some(5),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(failed.len(), 1);
    assert_eq!(
        history.get(&bad.run_id).await.unwrap().as_ref(),
        Some(&failed[0])
    );
    m.shutdown(Duration::from_secs(10)).await;
    rows.into_iter()
        .map(|mut r| {
            r.run_id.clear();
            r.created_at.clear();
            r.started_at = r.started_at.map(|_| "t".into());
            r.ended_at = r.ended_at.map(|_| "t".into());
            r.duration_ms = r.duration_ms.map(|_| 0);
            r.queued_ms = r.queued_ms.map(|_| 0);
            r.instance.clear();
            r
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_records_the_same_rows_into_postgres_as_into_sqlite() {
    let pg = PgCluster::start();
    let url = pg.create_database("one");
    let dir = tempfile::tempdir().unwrap();
    let in_postgres = record_three_runs(&postgres(&url, "p", dir.path())).await;
    let (sqlite, _sqlite_dir) = crate::mcp_support::temp_history();
    let in_sqlite = record_three_runs(&sqlite).await;
    assert_eq!(in_postgres, in_sqlite);
    let statuses: Vec<Status> = in_postgres.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            Status::Stopped,
            Status::Stopped,
            Status::Failed,
            Status::Succeeded
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_on_another_host_is_dead_only_once_its_heartbeat_is_older_than_the_expiry() {
    let pg = PgCluster::start();
    let url = pg.create_database("beats");
    // Three data directories: three hosts, as far as lock files can tell.
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let alive = postgres(&url, "alive", dirs[0].path());
    let gone = postgres(&url, "gone", dirs[1].path());
    let mut ids = Vec::new();
    for (h, instance) in [(&alive, "alive"), (&gone, "gone")] {
        let id = format!("run-of-{instance}");
        h.insert(NewRun::new(
            &id,
            "bash",
            RunLimits {
                memory_mb: 512,
                timeout_seconds: 30.0,
                cpus: 1.0,
            },
            "sleep 1000",
            CodePolicy::Preview,
            instance,
        ));
        h.started(&id);
        h.query(Query::default()).await.unwrap();
        ids.push(id);
    }
    // `gone` stopped beating a while ago (by the database's clock); `alive` just did.
    let expiry = INSTANCE_EXPIRY.as_millis() as i64;
    pg.with_client("beats", |c| {
        c.execute(
            "UPDATE instances SET heartbeat_at = heartbeat_at - $1 WHERE id = 'gone'",
            &[&(expiry + 1000)],
        )
        .unwrap()
    });
    let third = postgres(&url, "third", dirs[2].path());
    let rows = third.query(Query::default()).await.unwrap();
    let status = |id: &str| rows.iter().find(|r| r.run_id == id).unwrap().status;
    assert_eq!(status(&ids[0]), Status::Running, "alive on its host");
    assert_eq!(status(&ids[1]), Status::SandboxError, "its server is gone");
    let w = third.whereabouts(&ids[0]).await.unwrap().unwrap();
    assert_eq!(w.instance, "alive");
    assert!(w.last_seen_ms_ago.unwrap() < 30_000, "{w:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_go_on_while_postgres_is_down_and_are_recorded_again_once_it_is_back() {
    let mut pg = PgCluster::start();
    let url = pg.create_database("outage");
    let dir = tempfile::tempdir().unwrap();
    let history = postgres(&url, "o", dir.path());
    let fake = Arc::new(FakeEngine::new());
    let m = manager_on(fake.clone(), |_| {}, Some(history.clone()));
    let before = m.submit(request("bash", "true")).unwrap().run_id;
    m.wait(&before, Duration::from_secs(10)).await.unwrap();
    assert_eq!(history.query(Query::default()).await.unwrap().len(), 1);

    pg.pause();
    let during = m.submit(request("bash", "true")).unwrap().run_id;
    let r = m.wait(&during, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        r.status,
        Status::Succeeded,
        "the outage does not touch the run"
    );
    let err = history.query(Query::default()).await.unwrap_err();
    assert!(err.to_string().contains("history"), "{err}");

    pg.restart();
    let mut after = String::new();
    // The history thread reconnects within its retry interval.
    for _ in 0..40 {
        after = m.submit(request("bash", "true")).unwrap().run_id;
        m.wait(&after, Duration::from_secs(10)).await.unwrap();
        if history.get(&after).await.is_ok_and(|r| r.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let row = history.get(&after).await.unwrap().expect("recorded again");
    assert_eq!(row.status, Status::Succeeded);
    assert!(history.get(&before).await.unwrap().is_some());
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn history_over_tls_follows_libpqs_sslmode_and_sslrootcert() {
    let pg = PgCluster::start_tls();
    pg.create_database("tls");
    let dir = tempfile::tempdir().unwrap();
    let encoded = |p: std::path::PathBuf| p.display().to_string().replace('/', "%2F");
    let (ca, other) = (encoded(pg.ca()), encoded(pg.other_ca()));
    let opens = |host: &str, params: String| {
        let url = pg.tcp_url(host, "tls", &params);
        let dir = dir.path().to_path_buf();
        async move {
            let h = postgres(&url, "tls-test", &dir);
            h.query(Query::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
    };
    // The server takes TLS only (hostnossl ... reject): each of these is encrypted.
    for (host, params) in [
        ("127.0.0.1", String::new()),
        ("127.0.0.1", "sslmode=prefer".into()),
        ("127.0.0.1", "sslmode=require".into()),
        ("127.0.0.1", format!("sslmode=verify-ca&sslrootcert={ca}")),
        ("localhost", format!("sslmode=verify-full&sslrootcert={ca}")),
    ] {
        opens(host, params.clone())
            .await
            .unwrap_or_else(|e| panic!("{host} {params}: {e}"));
    }
    for (host, params, words) in [
        ("127.0.0.1", "sslmode=disable".to_string(), "no encryption"),
        // The certificate names localhost, not 127.0.0.1.
        (
            "127.0.0.1",
            format!("sslmode=verify-full&sslrootcert={ca}"),
            "not valid for name",
        ),
        (
            "localhost",
            format!("sslmode=verify-full&sslrootcert={other}"),
            "UnknownIssuer",
        ),
        (
            "localhost",
            format!("sslmode=verify-ca&sslrootcert={other}"),
            "UnknownIssuer",
        ),
        (
            "localhost",
            format!("sslmode=require&sslrootcert={other}"),
            "UnknownIssuer",
        ),
    ] {
        let err = opens(host, params.clone()).await.unwrap_err();
        assert!(err.contains(words), "{host} {params}: {err}");
    }
}

/// A run with packages, finished and read back: its row keeps the report's `packages`, also
/// once the full report is forgotten.
async fn packages_are_read_back(history: &History) {
    use codebox::report::{InstalledPackage, PackagesReport, RunReport};
    let limits = RunLimits {
        memory_mb: 256,
        timeout_seconds: 10.0,
        cpus: 1.0,
    };
    history.insert(NewRun::new(
        "pk1",
        "python",
        limits,
        "import tinypkg",
        CodePolicy::Preview,
        "p",
    ));
    let mut r = RunReport::new(
        "pk1",
        "python",
        Status::Succeeded,
        limits,
        "exited with code 0",
    );
    let packages = PackagesReport {
        requested: vec!["tinypkg==1.0".into()],
        installed: vec![InstalledPackage {
            name: "tinypkg".into(),
            version: "1.0".into(),
        }],
        cached: false,
        install_ms: 1234,
    };
    r.packages = Some(packages.clone());
    history.finish(Arc::new(r));
    let stored = history.report("pk1", None).await.unwrap().expect("stored");
    assert_eq!(stored.packages.as_ref(), Some(&packages));
    history.forget_reports(vec!["pk1".into()]);
    assert_eq!(history.report("pk1", None).await.unwrap(), None);
    let row = history.get("pk1").await.unwrap().expect("row");
    assert_eq!(row.packages, Some(packages), "the row lost its packages");
    let rows = history.query(Query::default()).await.unwrap();
    assert_eq!(rows[0].packages, row.packages);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_packages_are_read_back_from_postgres_and_sqlite() {
    let pg = PgCluster::start();
    let url = pg.create_database("packages");
    let dir = tempfile::tempdir().unwrap();
    packages_are_read_back(&postgres(&url, "p", dir.path())).await;
    let (sqlite, _sqlite_dir) = crate::mcp_support::temp_history();
    packages_are_read_back(&sqlite).await;
}
