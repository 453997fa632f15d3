//! The caps and memory of sessions on the fake engine: over `sessions.max_sessions` or the
//! sessions' memory share a `create_session` is refused at once; a caller that goes away
//! gives back its place and memory; an install while a session opens holds its container's
//! memory.

use std::sync::Arc;
use std::time::Duration;

use codebox::contract::SessionError;
use codebox::contract::{LimitsInput, SessionRequest};
use codebox::engine::fake::FakeEngine;
use codebox::report::Status;

use crate::mcp_support::{eventually, fake_sessions};
use crate::sessions_support::{asking, open};

#[tokio::test]
async fn over_max_sessions_or_the_memory_share_creation_is_refused_at_once() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |c| {
        c.sessions.max_sessions = 2;
        c.runs.memory_budget_mb = 4096;
    });
    let a = m.create(open("python")).await.unwrap();
    m.create(open("python")).await.unwrap();
    let err = m.create(open("python")).await.unwrap_err();
    assert!(matches!(err, SessionError::Full(_)), "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("sessions.max_sessions"), "{err}");
    m.close(&a.session_id).unwrap();
    // Half of the 4096 MB budget is the sessions' share: 512 MB open, 2048 MB more is over.
    let big = SessionRequest {
        limits: Some(LimitsInput {
            memory_mb: Some(2048.0),
            ..Default::default()
        }),
        ..open("python")
    };
    let err = m.create(big).await.unwrap_err();
    assert!(
        err.to_string().contains("sessions.memory_budget_mb"),
        "{err}"
    );
    assert_eq!(m.stats().sessions.memory_mb, 512);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_create_session_whose_caller_goes_away_gives_back_its_place_and_memory() {
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_secs(3600),
    );
    let m = fake_sessions(&fake, |c| {
        c.sessions.max_sessions = 2;
        c.sessions.ready.clear();
    });
    for attempt in 1..=3 {
        let answer =
            tokio::time::timeout(Duration::from_millis(300), m.create(open("python"))).await;
        assert!(
            answer.is_err(),
            "attempt {attempt}: answered while its container was still starting: {:?}",
            answer.map(|r| r.map_err(|e| e.to_string()))
        );
    }
    assert_eq!(
        m.stats().sessions.memory_mb,
        0,
        "the memory of callers that went away is still held"
    );
    m.shutdown(Duration::from_secs(10)).await;
    eventually(10, "their containers are removed", || {
        fake.live_containers().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_session_installing_its_packages_holds_the_install_containers_memory() {
    // The install step's container runs while the session opens: runs admitted meanwhile
    // cannot take the memory it uses.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(400),
    );
    let m = fake_sessions(&fake, |c| {
        c.runs.memory_budget_mb = 2048;
        c.sessions.memory_budget_mb = Some(1024);
        c.packages.install_memory_mb = 1024;
        c.packages.python.index_url = Some("http://127.0.0.1:9/simple/".into());
        c.pool.sizes.clear();
        c.sessions.ready.clear();
    });
    let req = SessionRequest {
        packages: Some(vec!["tinypkg==1.0".into()]),
        ..open("python")
    };
    let opening = {
        let m = m.clone();
        tokio::spawn(async move { m.create(req).await })
    };
    eventually(10, "the install container is created", || {
        !fake.specs().is_empty()
    })
    .await;
    let run = m.submit(asking("python", 1024)).unwrap().run_id;
    assert_eq!(
        m.stats().queued,
        1,
        "a run was admitted into the memory the install uses"
    );
    let s = opening.await.unwrap();
    assert!(s.is_ok(), "{:?}", s.err().map(|e| e.to_string()));
    let r = m.runs().wait(&run, Duration::from_secs(30)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    m.shutdown(Duration::from_secs(10)).await;
}
