//! Sessions opened ahead of time (`sessions.ready`) on the fake engine: one serves one
//! `create_session` and is replaced; they give way to a `create_session` and give their
//! memory back to a run that needs it, even while still being opened; shutdown waits for and
//! removes them; the metrics show them.

use std::sync::Arc;
use std::time::Duration;

use codebox::contract::SessionRequest;
use codebox::engine::fake::{Behaviour, FakeEngine};
use codebox::report::{InterpreterState, Status};

use crate::mcp_support::{eventually, fake_sessions};
use crate::sessions_support::{asking, cell, open, run, state};

#[tokio::test]
async fn a_session_opened_ahead_of_time_serves_one_create_session_and_is_replaced() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    m.start_ready();
    eventually(10, "one python session is ready", || {
        fake.specs().len() == 1 && fake.session_requests().is_empty()
    })
    .await;
    let ready = fake.specs()[0].name.clone();
    assert_eq!(
        m.stats().sessions.memory_mb,
        512,
        "its memory is held while it waits"
    );
    assert!(
        m.list().sessions.is_empty(),
        "a ready container is no session yet"
    );
    let s = m.create(open("python")).await.unwrap();
    assert_eq!(fake.specs().len(), 1, "it took the ready container");
    // (The replacement's attach takes a behaviour from the script: script after it.)
    eventually(10, "a replacement is ready", || fake.specs().len() == 2).await;
    fake.script(Behaviour::Result("1".into()));
    let r = run(&m, cell(&s, "1")).await;
    assert_eq!(r.result.as_deref(), Some("1"), "{}", r.message);
    assert_eq!(state(&r).1, InterpreterState::New);
    assert_eq!(
        m.stats().sessions.memory_mb,
        1024,
        "the session and its replacement"
    );
    // With files (or other limits) a session gets a container of its own.
    let with_files = SessionRequest {
        files: Some(vec![codebox::contract::FileInput {
            path: "a.txt".into(),
            content: "x".into(),
            encoding: None,
        }]),
        ..open("python")
    };
    m.create(with_files).await.unwrap();
    assert_eq!(fake.specs().len(), 3);
    m.close(&s.session_id).unwrap();
    eventually(10, "the used one is removed", || {
        !fake.live_containers().contains(&ready)
    })
    .await;
    m.shutdown(Duration::from_secs(10)).await;
    eventually(10, "shutdown removes the ready ones too", || {
        fake.live_containers().is_empty()
    })
    .await;
    assert_eq!(m.stats().sessions.memory_mb, 0);
}

#[tokio::test]
async fn shutdown_waits_for_a_session_being_opened_ahead_of_time_and_removes_it() {
    // Found under load: `serve` got SIGTERM while a ready session's container was starting;
    // the opening was not waited for and its container outlived the process.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(500),
    );
    let m = fake_sessions(&fake, |_| {});
    m.start_ready();
    eventually(10, "a session's container is created", || {
        fake.specs().len() == 1
    })
    .await;
    m.shutdown(Duration::from_secs(10)).await;
    assert_eq!(
        fake.live_containers(),
        Vec::<String>::new(),
        "shutdown returned with a container of a session being opened"
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(fake.live_containers(), Vec::<String>::new());
    assert_eq!(m.stats().sessions.memory_mb, 0);
}

#[tokio::test]
async fn a_run_needing_the_memory_of_a_session_opened_ahead_of_time_gets_it_back() {
    // Found with `serve`: a run asking for the whole budget right after start waited until
    // the ready python session expired, and every run behind it waited too.
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |c| {
        c.pool.idle_seconds = 3600;
        c.limits.max_memory_mb = c.runs.memory_budget_mb;
    });
    m.start_ready();
    eventually(10, "one python session is ready", || {
        fake.specs().len() == 1 && m.stats().sessions.memory_mb == 512
    })
    .await;
    let budget = m.runs().config().runs.memory_budget_mb;
    let id = m.submit(asking("python", budget)).unwrap().run_id;
    let r = m.runs().wait(&id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(
        r.status,
        Status::Succeeded,
        "the run still waits behind the ready session: {}",
        r.message
    );
    m.shutdown(Duration::from_secs(10)).await;
    assert!(fake.live_containers().is_empty());
}

#[tokio::test]
async fn a_whole_budget_run_right_after_start_gets_back_what_is_still_being_opened() {
    // Found with `serve` (stdio): a run asking for the whole budget sent right after start
    // waited until the pool's containers expired (301 s). The pool and the session opened
    // ahead of time were still being made when it asked; once made, nobody asked again.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(300),
    );
    let m = fake_sessions(&fake, |c| {
        c.pool.idle_seconds = 3600;
        c.pool.sizes = [("python".to_string(), 1)].into_iter().collect();
        c.limits.max_memory_mb = c.runs.memory_budget_mb;
    });
    m.runs().start_pool();
    m.start_ready();
    assert!(
        m.stats().sessions.memory_mb > 0 && m.stats().pool.stats.filling > 0,
        "the pool and a session are being opened ahead of time"
    );
    let budget = m.runs().config().runs.memory_budget_mb;
    let id = m.submit(asking("python", budget)).unwrap().run_id;
    let r = m.runs().wait(&id, Duration::from_secs(30)).await.unwrap();
    assert_eq!(
        r.status,
        Status::Succeeded,
        "the run still waits for what was opened ahead of time: {}",
        r.message
    );
    m.shutdown(Duration::from_secs(10)).await;
    assert!(fake.live_containers().is_empty());
}

#[tokio::test]
async fn sessions_opened_ahead_of_time_give_way_to_a_create_session() {
    // Found with `serve`: 7 javascript sessions plus the ready python one refused the 8th.
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |c| {
        c.pool.idle_seconds = 3600;
        c.sessions.max_sessions = 2;
        c.sessions.memory_budget_mb = Some(1024);
    });
    m.start_ready();
    eventually(10, "one python session is ready", || {
        fake.specs().len() == 1 && m.stats().sessions.memory_mb == 512
    })
    .await;
    let ready = fake.specs()[0].name.clone();
    m.create(open("javascript")).await.unwrap();
    let second = m.create(open("javascript")).await;
    assert!(
        second.is_ok(),
        "the ready python session did not give way: {:?}",
        second.err().map(|e| e.to_string())
    );
    eventually(10, "the ready container is removed", || {
        !fake.live_containers().contains(&ready)
    })
    .await;
    let err = m.create(open("javascript")).await.unwrap_err();
    assert!(
        err.is_retryable() && err.to_string().contains("sessions.max_sessions"),
        "{err}"
    );
    assert_eq!(m.stats().sessions.memory_mb, 1024);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn metrics_show_sessions_opened_ahead_of_time_and_what_they_hold() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    m.start_ready();
    eventually(10, "one python session is ready", || {
        m.stats().sessions.ready == 1
    })
    .await;
    let text = m
        .runs()
        .metrics()
        .render(&m.stats(), &codebox::executor::timings::Timings::default());
    assert!(text.contains("\ncodebox_sessions_ready 1\n"), "{text}");
    assert!(
        text.contains("\ncodebox_sessions_memory_mb 512\n"),
        "{text}"
    );
    assert!(text.contains("\ncodebox_sessions_open 0\n"), "{text}");
    m.shutdown(Duration::from_secs(10)).await;
}
