//! The run manager's guarantees, on the fake engine (fast, no Docker): admission queue bound,
//! concurrency cap, memory budget with strict FIFO, stop of queued and running runs,
//! retention, the memory bound on retained reports (with the history as fallback), panics,
//! history rows.

use std::sync::Arc;
use std::time::Duration;

use codebox::contract::{LimitsInput, RunRequest};
use codebox::engine::fake::{Behaviour, FakeEngine};
use codebox::history::Query;
use codebox::report::RunReport;
use codebox::report::Status;
use codebox::runs::{LookupError, RunManager, SubmitError};
use serde_json::json;

use crate::common::request;
use crate::mcp_support::{
    connect, eventually, fake_manager, manager_on, ok, temp_history, tool_error,
};

fn with_memory(language: &str, mb: f64) -> RunRequest {
    RunRequest {
        limits: Some(LimitsInput {
            memory_mb: Some(mb),
            ..Default::default()
        }),
        ..request(language, "print(1)")
    }
}

fn status(m: &RunManager, id: &str) -> Status {
    m.report(id).expect("known run").status
}

#[tokio::test]
async fn a_full_queue_is_a_clear_retryable_rejection() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| {
        c.runs.max_concurrent_runs = 1;
        c.runs.max_queued_runs = 2;
    });
    let ids: Vec<String> = (0..3)
        .map(|_| m.submit(request("python", "print(1)")).unwrap().run_id)
        .collect();
    let err = m.submit(request("python", "print(1)")).unwrap_err();
    assert!(err.is_retryable());
    assert!(
        matches!(err, SubmitError::QueueFull { waiting: 2, max: 2 }),
        "{err:?}"
    );
    assert!(err.to_string().contains("retry"), "{err}");
    // Stopping a queued run frees a place in the queue.
    assert_eq!(m.stop(&ids[2]).await.unwrap().status, Status::Stopped);
    m.submit(request("python", "print(1)")).unwrap();
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn never_more_than_max_concurrent_runs_execute_and_the_rest_wait_in_order() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| c.runs.max_concurrent_runs = 3);
    let ids: Vec<String> = (0..10)
        .map(|_| m.submit(request("python", "print(1)")).unwrap().run_id)
        .collect();
    eventually(10, "three runs started", || fake.started() == 3).await;
    let s = m.stats();
    assert_eq!((s.active, s.queued, s.peak_active), (3, 7, 3));
    assert_eq!(status(&m, &ids[0]), Status::Running);
    assert_eq!(status(&m, &ids[3]), Status::Queued);
    assert!(m.report(&ids[3]).unwrap().message.contains("number 1 of 7"));
    // Stopping a running run admits the head of the queue, not a later one.
    assert_eq!(m.stop(&ids[0]).await.unwrap().status, Status::Stopped);
    eventually(10, "the head of the queue started", || {
        status(&m, &ids[3]) == Status::Running
    })
    .await;
    assert_eq!(status(&m, &ids[4]), Status::Queued);
    m.shutdown(Duration::from_secs(10)).await;
    for id in &ids {
        assert_eq!(status(&m, id), Status::Stopped, "run {id}");
    }
    assert_eq!(m.stats().peak_active, 3);
    eventually(10, "containers removed", || {
        fake.live_containers().is_empty()
    })
    .await;
}

#[tokio::test]
async fn memory_budget_bounds_admission_and_a_big_request_at_the_head_is_not_starved() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| {
        c.runs.max_concurrent_runs = 10;
        c.runs.memory_budget_mb = 1024;
    });
    let a = m.submit(with_memory("python", 512.0)).unwrap();
    let b = m.submit(with_memory("python", 1024.0)).unwrap();
    let c = m.submit(with_memory("python", 256.0)).unwrap();
    assert_eq!(a.status, Status::Running);
    assert_eq!(b.status, Status::Queued);
    // c would fit next to a, but b is first in line.
    assert_eq!(c.status, Status::Queued);
    assert_eq!(m.stats().active_memory_mb, 512);
    m.stop(&a.run_id).await.unwrap();
    eventually(10, "b started", || status(&m, &b.run_id) == Status::Running).await;
    assert_eq!(status(&m, &c.run_id), Status::Queued);
    assert_eq!(m.stats().active_memory_mb, 1024);
    m.stop(&b.run_id).await.unwrap();
    eventually(10, "c started", || status(&m, &c.run_id) == Status::Running).await;
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_request_larger_than_the_whole_budget_is_rejected_naming_limits_memory_mb() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| c.runs.memory_budget_mb = 2048);
    let err = m.submit(with_memory("python", 4096.0)).unwrap_err();
    assert!(!err.is_retryable());
    let msg = err.to_string();
    assert!(msg.starts_with("limits.memory_mb:"), "{msg}");
    assert!(msg.contains("2048"), "{msg}");
    // Compiled languages are charged their compile stage's memory (1024 MB by default).
    let m = fake_manager(&fake, |c| c.runs.memory_budget_mb = 1000);
    assert!(m.submit(with_memory("cpp", 256.0)).is_err());
    assert!(fake.specs().is_empty(), "nothing reached the engine");
}

#[tokio::test]
async fn stopping_a_queued_run_ends_it_stopped_at_once_without_touching_the_engine() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |c| c.runs.max_concurrent_runs = 1);
    let first = m.submit(request("python", "print(1)")).unwrap();
    let queued = m.submit(request("python", "print(2)")).unwrap();
    eventually(10, "first started", || fake.started() == 1).await;
    let specs_before = fake.specs().len();
    let r = m.stop(&queued.run_id).await.unwrap();
    assert_eq!(r.status, Status::Stopped);
    assert!(r.message.contains("queue"), "{}", r.message);
    assert_eq!(fake.specs().len(), specs_before);
    m.stop(&first.run_id).await.unwrap();
}

#[tokio::test]
async fn stopping_a_running_run_kills_it_and_removes_its_containers() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let m = fake_manager(&fake, |_| {});
    let run = m.submit(request("python", "print(1)")).unwrap();
    eventually(10, "started", || fake.started() == 1).await;
    assert!(!fake.live_containers().is_empty());
    let r = m.stop(&run.run_id).await.unwrap();
    assert_eq!(r.status, Status::Stopped);
    assert_eq!(m.stats().active, 0);
    eventually(10, "its container removed", || {
        fake.live_containers().is_empty()
    })
    .await;
}

#[tokio::test]
async fn stop_on_a_finished_run_returns_its_final_report_unchanged() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(codebox::engine::fake::exited(3, "out\n"));
    let m = fake_manager(&fake, |_| {});
    let run = m.submit(request("python", "print(1)")).unwrap();
    let done = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(done.status, Status::Failed);
    assert_eq!(m.stop(&run.run_id).await.unwrap(), done);
    assert_eq!(m.stop(&run.run_id).await.unwrap(), done);
    assert!(matches!(
        m.stop("no-such-run").await,
        Err(LookupError::Unknown { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn reports_are_kept_for_the_retention_then_forgotten() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| c.runs.result_retention_seconds = 3600);
    let run = m.submit(request("python", "print(1)")).unwrap();
    let done = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(done.status, Status::Succeeded);
    tokio::time::sleep(Duration::from_secs(3590)).await;
    m.purge_expired();
    assert_eq!(
        m.report(&run.run_id).unwrap(),
        done,
        "kept for the whole retention"
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    m.purge_expired();
    assert!(
        m.report(&run.run_id).is_none(),
        "forgotten after the retention"
    );
}

#[tokio::test]
async fn a_panic_in_a_run_task_becomes_a_sandbox_error_report_and_frees_the_slot() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::Panic);
    let (history, _dir) = temp_history();
    let m = manager_on(
        fake.clone(),
        |c| c.runs.max_concurrent_runs = 1,
        Some(history.clone()),
    );
    let run = m.submit(request("python", "print(1)")).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message
            .contains("a task panicked: fake engine told to panic"),
        "{}",
        r.message
    );
    assert_eq!(m.stats().active, 0);
    eventually(10, "the panicked run's containers are removed", || {
        fake.live_containers().is_empty()
    })
    .await;
    // The slot is free again.
    let next = m.submit(request("python", "print(1)")).unwrap();
    assert_eq!(next.status, Status::Running);
    m.wait(&next.run_id, Duration::from_secs(10)).await.unwrap();
    let row = history.get(&run.run_id).await.unwrap().unwrap();
    assert_eq!(row.status, Status::SandboxError);
}

#[tokio::test]
async fn each_run_gets_one_history_row_inserted_at_admission_and_completed_at_the_end() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let (history, _dir) = temp_history();
    let m = manager_on(
        fake.clone(),
        |c| c.runs.max_concurrent_runs = 1,
        Some(history.clone()),
    );
    m.submit(request("python", "print('running')")).unwrap();
    let queued = m.submit(request("py", "print('queued')")).unwrap();
    eventually(10, "started", || fake.started() == 1).await;
    let rows = history.query(Query::default()).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[0].run_id, queued.run_id, "newest first");
    assert_eq!(rows[0].status, Status::Queued);
    assert_eq!(rows[1].status, Status::Running);
    assert_eq!(rows[1].code_preview.as_deref(), Some("print('running')"));
    assert_eq!(
        rows[1].code_sha256,
        codebox::history::sha256_hex("print('running')")
    );
    m.shutdown(Duration::from_secs(10)).await;
    let rows = history.query(Query::default()).await.unwrap();
    assert!(
        rows.iter()
            .all(|r| r.status == Status::Stopped && r.ended_at.is_some()),
        "{rows:?}"
    );
    let only = history
        .query(Query {
            status: Some(Status::Stopped),
            language: Some("python".into()),
            limit: Some(1),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(only.len(), 1);
    assert!(history
        .query(Query {
            language: Some("cpp".into()),
            ..Default::default()
        })
        .await
        .unwrap()
        .is_empty());
}

#[tokio::test]
async fn the_code_policy_decides_how_much_code_history_keeps() {
    for (policy, expect) in [
        (codebox::config::CodePolicy::None, None),
        (codebox::config::CodePolicy::Full, Some(600)),
        (codebox::config::CodePolicy::Preview, Some(500)),
    ] {
        let fake = Arc::new(FakeEngine::new());
        let (history, _dir) = temp_history();
        let m = manager_on(
            fake.clone(),
            |c| c.history.code = policy,
            Some(history.clone()),
        );
        let code = format!("print(1)#{}", "x".repeat(591));
        let run = m.submit(request("python", &code)).unwrap();
        m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
        let row = history.get(&run.run_id).await.unwrap().unwrap();
        assert_eq!(
            row.code_preview.map(|p| p.chars().count()),
            expect,
            "{policy:?}"
        );
        assert_eq!(row.code_bytes, 600);
        assert_eq!(row.status, Status::Succeeded);
    }
}

#[tokio::test]
async fn after_shutdown_new_runs_are_refused() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |_| {});
    m.shutdown(Duration::from_secs(1)).await;
    let err = m.submit(request("python", "print(1)")).unwrap_err();
    assert_eq!(err, SubmitError::ShuttingDown);
    assert!(!err.is_retryable());
}

/// Output of each run in the retained-reports tests: three of them exceed 1 MB.
const BIG_OUTPUT: usize = 400 * 1024;

/// Run `n` Python programs one after the other, each printing [`BIG_OUTPUT`] bytes of its own
/// letter; returns their final reports, oldest first.
async fn big_runs(fake: &FakeEngine, m: &RunManager, n: usize) -> Vec<RunReport> {
    let mut done = Vec::new();
    for letter in ["a", "b", "c", "d"].into_iter().take(n) {
        fake.script(codebox::engine::fake::exited(0, &letter.repeat(BIG_OUTPUT)));
        let run = m.submit(request("python", "print(1)")).unwrap();
        let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
        assert_eq!((r.status, r.stdout.len()), (Status::Succeeded, BIG_OUTPUT));
        done.push(r);
    }
    done
}

#[tokio::test]
async fn a_tiny_retained_reports_budget_evicts_the_oldest_reports_which_stay_answerable_from_history(
) {
    let fake = Arc::new(FakeEngine::new());
    let (history, _dir) = temp_history();
    let m = manager_on(
        fake.clone(),
        |c| {
            c.runs.retained_reports_mb = 1;
            c.runs.max_concurrent_runs = 1;
        },
        Some(history.clone()),
    );
    let done = big_runs(&fake, &m, 3).await;
    let s = m.stats();
    assert_eq!((s.retained, s.evicted), (2, 1), "{s:?}");
    assert!(s.retained_report_bytes <= 1024 * 1024, "{s:?}");
    assert!(
        m.report(&done[0].run_id).is_none(),
        "the oldest left memory"
    );
    assert_eq!(m.report(&done[2].run_id).as_ref(), Some(&done[2]));
    // get_result and stop_run still answer with the whole final report, from the history.
    assert_eq!(
        m.wait(&done[0].run_id, Duration::ZERO).await.unwrap(),
        done[0]
    );
    assert_eq!(m.stop(&done[0].run_id).await.unwrap(), done[0]);
    let client = connect(m.clone()).await;
    let got = ok(&client, "get_result", json!({"run_id": done[0].run_id})).await;
    assert_eq!(got, serde_json::to_value(&done[0]).unwrap());
    // A fourth run evicts the second; the first two come from the history, the rest from memory.
    let more = big_runs(&fake, &m, 1).await;
    assert_eq!(m.stats().evicted, 2);
    for r in done.iter().chain(&more) {
        assert_eq!(&m.wait(&r.run_id, Duration::ZERO).await.unwrap(), r);
    }
    client.cancel().await.unwrap();
    // A server started later on the same database answers too, within the retention.
    let restarted = manager_on(fake.clone(), |_| {}, Some(history.clone()));
    assert_eq!(
        restarted
            .wait(&more[0].run_id, Duration::ZERO)
            .await
            .unwrap(),
        more[0]
    );
}

#[tokio::test]
async fn evicted_reports_without_history_give_a_clear_error_naming_the_setting() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        c.runs.retained_reports_mb = 1;
        c.runs.max_concurrent_runs = 1;
    });
    let done = big_runs(&fake, &m, 3).await;
    let s = m.stats();
    assert_eq!((s.retained, s.evicted), (2, 1), "memory bound holds: {s:?}");
    let err = m.wait(&done[0].run_id, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LookupError::Evicted { .. }), "{err:?}");
    let client = connect(m.clone()).await;
    for tool in ["get_result", "stop_run"] {
        let msg = tool_error(&client, tool, json!({"run_id": done[0].run_id})).await;
        assert!(
            msg.contains("run_id")
                && msg.contains(&done[0].run_id)
                && msg.contains("evicted")
                && msg.contains("`runs.retained_reports_mb`")
                && msg.contains("no history"),
            "{msg}"
        );
    }
    // Reports still in memory answer as before; an id never seen is still just unknown.
    let got = ok(&client, "get_result", json!({"run_id": done[2].run_id})).await;
    assert_eq!(got, serde_json::to_value(&done[2]).unwrap());
    let msg = tool_error(&client, "get_result", json!({"run_id": "0123456789abcdef"})).await;
    assert!(msg.contains("no run"), "{msg}");
    client.cancel().await.unwrap();
}

#[tokio::test]
async fn full_reports_are_cleared_from_history_after_the_retention() {
    let fake = Arc::new(FakeEngine::new());
    let (history, _dir) = temp_history();
    let m = manager_on(
        fake.clone(),
        |c| {
            c.runs.retained_reports_mb = 1;
            c.runs.max_concurrent_runs = 1;
            c.runs.result_retention_seconds = 3600;
        },
        Some(history.clone()),
    );
    let done = big_runs(&fake, &m, 3).await;
    assert!(
        m.report(&done[0].run_id).is_none(),
        "the oldest was evicted"
    );
    for r in &done {
        assert_eq!(
            history.report(&r.run_id, None).await.unwrap().as_ref(),
            Some(r)
        );
    }
    // Time is paused only now: while paused, awaiting the history thread lets tokio jump to
    // the next timer, which must not expire the reports before the checks above.
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(3590)).await;
    m.purge_expired();
    assert_eq!(
        m.wait(&done[0].run_id, Duration::ZERO).await.unwrap(),
        done[0]
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    m.purge_expired();
    assert_eq!(m.stats().evicted, 0);
    for r in &done {
        assert_eq!(
            history.report(&r.run_id, None).await.unwrap(),
            None,
            "full report cleared"
        );
        let row = history
            .get(&r.run_id)
            .await
            .unwrap()
            .expect("the row stays");
        assert_eq!(
            (row.status, row.stdout_bytes),
            (Status::Succeeded, BIG_OUTPUT as u64)
        );
        let err = m.wait(&r.run_id, Duration::ZERO).await.unwrap_err();
        assert!(matches!(err, LookupError::Unknown { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn a_run_with_packages_is_charged_its_install_containers_memory() {
    // The install step's container (packages.install_memory_mb) runs inside the run's
    // admission: a run asking for less than it is charged the install's memory, so runs
    // admitted beside it cannot take what the install uses.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(500),
    );
    let m = fake_manager(&fake, |c| {
        c.runs.memory_budget_mb = 1536;
        c.runs.max_concurrent_runs = 4;
        c.packages.install_memory_mb = 1024;
        c.packages.python.index_url = Some("http://127.0.0.1:9/simple/".into());
        c.pool.sizes.clear();
        c.sessions.ready.clear();
    });
    let with_packages = RunRequest {
        packages: Some(vec!["tinypkg==1.0".into()]),
        ..with_memory("python", 256.0)
    };
    let a = m.submit(with_packages).unwrap().run_id;
    let b = m.submit(with_memory("python", 768.0)).unwrap().run_id;
    let s = m.stats();
    assert_eq!(
        (s.active, s.queued, s.active_memory_mb),
        (1, 1, 1024),
        "the second run was admitted beside the install"
    );
    for id in [a, b] {
        m.wait(&id, Duration::from_secs(30)).await.unwrap();
    }
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_unknown_run_id_costs_a_handful_of_history_lookups() {
    let fake = Arc::new(FakeEngine::new());
    let (history, _dir) = temp_history();
    let m = manager_on(fake, |_| {}, Some(history.clone()));
    let before = history.lookups();
    let answer = m.wait("r_0123456789abcdef", Duration::from_secs(5)).await;
    assert!(
        matches!(answer, Err(LookupError::Unknown { .. })),
        "{answer:?}"
    );
    let lookups = history.lookups() - before;
    assert!(
        lookups <= 12,
        "{lookups} history lookups for one unknown id"
    );
}
