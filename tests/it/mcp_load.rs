//! Load: 100 `start_run` calls at once through MCP, on real Docker, with at most 4 runs at
//! once. Every run ends, the cap holds (by the manager's count and by `docker ps`), history
//! has every row, nothing labelled remains. Plus the queue bound under the same burst.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use codebox::config::Config;
use codebox::engine::fake::FakeEngine;
use codebox::executor::Executor;
use codebox::history::{History, Owner, Query};
use codebox::runs::RunManager;
use futures_util::future::join_all;
use serde_json::json;

use crate::common::registry;
use crate::mcp_support::{call, connect, fake_manager, params, text};

fn running_containers(instance: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-q",
            "--filter",
            &format!("label=codebox.instance={instance}"),
        ])
        .output()
        .expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).lines().count()
}

fn all_containers(instance: &str) -> Vec<String> {
    let mut found = Vec::new();
    for args in [vec!["ps", "-aq"], vec!["volume", "ls", "-q"]] {
        let out = std::process::Command::new("docker")
            .args(args)
            .args(["--filter", &format!("label=codebox.instance={instance}")])
            .output()
            .expect("docker CLI");
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string),
        );
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_100_runs_never_exceeds_4_at_once_and_all_end_recorded_and_cleaned() {
    // An instance id of its own, so `docker ps` counts only this test's containers.
    let instance = format!("load{}", uuid::Uuid::new_v4().simple());
    let dir = tempfile::tempdir().unwrap();
    let history = History::open(
        &dir.path().join("history.sqlite3"),
        Owner {
            instance: instance.clone(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        },
    );
    let mut config = Config::default();
    config.runs.max_concurrent_runs = 4;
    let config = Arc::new(config);
    let executor = Arc::new(Executor::new(
        Arc::new(crate::common::docker_engine().unwrap()),
        config.clone(),
        instance.clone(),
    ));
    let m = RunManager::new(executor, registry(), config, Some(history.clone()));
    let client = connect(m.clone()).await;

    // Watch Docker from the side while the burst runs.
    let watching = Arc::new(AtomicBool::new(true));
    let most_seen = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (watching, most_seen, instance) =
            (watching.clone(), most_seen.clone(), instance.clone());
        std::thread::spawn(move || {
            while watching.load(Ordering::Relaxed) {
                most_seen.fetch_max(running_containers(&instance), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let started = Instant::now();
    let calls = (0..100).map(|i| {
        let client = &client;
        async move {
            let res = call(
                client,
                "start_run",
                json!({"language": "python", "code": format!("print({i} * 2)")}),
            )
            .await;
            assert_ne!(res.is_error, Some(true), "start_run {i}: {}", text(&res));
            res.structured_content.unwrap()["run_id"]
                .as_str()
                .unwrap()
                .to_string()
        }
    });
    let ids: Vec<String> = join_all(calls).await;
    assert_eq!(
        ids.iter().collect::<HashSet<_>>().len(),
        100,
        "run ids are unique"
    );
    let waits = ids.iter().enumerate().map(|(i, id)| {
        let client = &client;
        async move {
            loop {
                let res = client
                    .call_tool(params(
                        "get_result",
                        json!({"run_id": id, "wait_seconds": 60}),
                    ))
                    .await
                    .unwrap();
                let r = res.structured_content.unwrap();
                match r["status"].as_str().unwrap() {
                    "queued" | "running" => continue,
                    "succeeded" => {
                        assert_eq!(r["stdout"], format!("{}\n", i * 2));
                        return;
                    }
                    other => panic!("run {i} ended {other}: {r}"),
                }
            }
        }
    });
    join_all(waits).await;
    let elapsed = started.elapsed().as_secs_f64();
    watching.store(false, Ordering::Relaxed);
    watcher.join().unwrap();
    println!(
        "load: 100 python runs, max_concurrent_runs 4: {elapsed:.1} s, {:.2} runs/s",
        100.0 / elapsed
    );

    let s = m.stats();
    assert!(
        s.peak_active <= 4,
        "the manager ran {} at once",
        s.peak_active
    );
    assert_eq!((s.active, s.queued), (0, 0));
    assert!(
        most_seen.load(Ordering::Relaxed) <= 4,
        "docker ps saw {} running",
        most_seen.load(Ordering::Relaxed)
    );
    assert_eq!(m.metrics().finished_with("succeeded"), 100);
    let rows = history
        .query(Query {
            limit: Some(1000),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rows.len(), 100, "one history row per run");
    assert!(rows
        .iter()
        .all(|r| r.status == codebox::report::Status::Succeeded && ids.contains(&r.run_id)));
    // Containers go right after their report: wait for the last removals.
    crate::mcp_support::eventually(30, "every container is removed", || {
        all_containers(&instance).is_empty()
    })
    .await;
}

#[tokio::test]
async fn the_queue_bound_holds_under_a_burst() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| {
        c.runs.max_concurrent_runs = 4;
        c.runs.max_queued_runs = 10;
    });
    let client = connect(m.clone()).await;
    let calls = (0..100).map(|_| {
        call(
            &client,
            "start_run",
            json!({"language": "python", "code": "print(1)"}),
        )
    });
    let results = join_all(calls).await;
    let accepted = results.iter().filter(|r| r.is_error != Some(true)).count();
    let refused: Vec<String> = results
        .iter()
        .filter(|r| r.is_error == Some(true))
        .map(text)
        .collect();
    assert_eq!(accepted, 14, "4 running + 10 queued");
    assert_eq!(refused.len(), 86);
    assert!(
        refused
            .iter()
            .all(|t| t.contains("busy") && t.contains("retry")),
        "{refused:?}"
    );
    let s = m.stats();
    assert_eq!((s.active, s.queued), (4, 10));
    m.shutdown(Duration::from_secs(10)).await;
}
