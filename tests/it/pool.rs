//! Containers started ahead of time: each serves one run, is removed after it, is replaced
//! after waiting too long, and gives its memory back to a queued run; how many are kept
//! follows demand (bursts, limit classes) between `pool.sizes` and `pool.max_ready`. Control
//! flow on the fake engine; the real thing against Docker.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use codebox::config::Config;
use codebox::engine::fake::FakeEngine;
use codebox::report::Status;
use codebox::runs::RunManager;

use crate::common::{limits, py, request};
use crate::mcp_support::{docker_manager, eventually, fake_manager};

fn pooled(sizes: &[(&str, usize)]) -> impl FnOnce(&mut Config) {
    let sizes: BTreeMap<String, usize> = sizes.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    move |c: &mut Config| c.pool.sizes = sizes
}

fn idle(m: &RunManager) -> usize {
    m.stats().pool.stats.idle.values().sum()
}

#[tokio::test]
async fn a_run_takes_a_ready_container_which_is_then_removed_and_replaced() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "one python container is ready", || idle(&m) == 1).await;
    let before = fake.specs();
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].labels["codebox.run"], "pool");
    assert_eq!(fake.started(), 1, "started ahead of time");
    let run = m.submit(request("python", "print(1)")).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let s = m.stats().pool;
    assert_eq!((s.hits, s.misses), (1, 0));
    assert_eq!(
        fake.payloads().len(),
        1,
        "the run's payload went to the pooled container"
    );
    eventually(10, "a fresh container replaces it", || {
        idle(&m) == 1 && fake.specs().len() == 2
    })
    .await;
    let live = fake.live_containers();
    assert_eq!(live.len(), 1, "the used container was removed: {live:?}");
    assert_ne!(live[0], before[0].name, "a container never serves two runs");
    m.shutdown(Duration::from_secs(10)).await;
    m.executor().cleanup().drain(Duration::from_secs(10)).await;
    assert!(
        fake.live_containers().is_empty(),
        "shutdown removes the pool"
    );
}

#[tokio::test]
async fn other_limits_update_a_ready_container_of_the_same_image() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let name = fake.specs()[0].name.clone();
    let mut req = py("print(1)");
    req.limits = Some(codebox::contract::LimitsInput {
        memory_mb: Some(1024.0),
        cpus: Some(0.5),
        ..Default::default()
    });
    let run = m.submit(req).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let updated = fake.updated(&name);
    assert!(updated.is_some(), "{:?}", m.stats().pool);
    let u = updated.unwrap();
    assert_eq!(
        (u.memory_bytes, u.cpu_quota_us, u.cpu_period_us),
        (1024 << 20, 50_000, 100_000)
    );
    assert_eq!(m.stats().pool.updated_hits, 1);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn where_the_runtime_cannot_update_limits_runs_asking_for_other_limits_often_get_a_class() {
    // runsc refuses `docker update`: the first run with other limits finds out, the container
    // it tried is removed unused, and later runs leave the default ones alone. The second run
    // of those limits within a minute makes them a class the pool keeps ready: the third
    // takes one of its own limits, with no update.
    let fake = Arc::new(FakeEngine::new());
    fake.fail_at(codebox::engine::fake::Step::Update);
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let big = || {
        let mut req = py("print(1)");
        req.limits = limits(Some(1024.0), None);
        req
    };
    for _ in 0..2 {
        let run = m.submit(big()).unwrap();
        let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    }
    let s = m.stats().pool;
    assert_eq!((s.hits, s.updated_hits, s.misses), (0, 0, 2), "{s:?}");
    eventually(10, "a container of the class is ready", || idle(&m) == 2).await;
    let run = m.submit(big()).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let s = m.stats().pool;
    assert_eq!((s.hits, s.misses), (1, 2), "{s:?}");
    assert_eq!(
        fake.calls(codebox::engine::fake::Step::Update),
        1,
        "only the first run tried an update"
    );
    let class = fake
        .specs()
        .iter()
        .filter(|s| s.labels["codebox.run"] == "pool" && s.memory_bytes == 1024 << 20)
        .count();
    assert!(class >= 1, "the class's container was made ahead of time");
    let run = m.submit(py("print(1)")).unwrap();
    m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        m.stats().pool.hits,
        2,
        "runs of the default shape still use the default class"
    );
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_run_on_a_ready_container_asks_the_engine_nothing_after_its_output() {
    // codebox-init reports how the run ended and its OOM kills: no wait, no inspect, no
    // update when the limits are the pool's, one attach; the report names the image the
    // container was created from.
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let run = m.submit(py("print(1)")).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!(m.stats().pool.hits, 1);
    use codebox::engine::fake::Step;
    assert_eq!(
        [Step::Wait, Step::Inspect, Step::Update, Step::Attach].map(|s| fake.calls(s)),
        [0, 0, 0, 1]
    );
    let id = "sha256:fake-codebox/python:3.11";
    assert_eq!(r.image_id.as_deref(), Some(id));
    assert_eq!(fake.specs()[0].image, id, "created from the image's id");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_image_whose_helper_predates_check_in_run_gets_the_check_then_the_program() {
    let fake = Arc::new(FakeEngine::new());
    fake.old_init();
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let run = m.submit(py("print(1)")).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let p = &fake.payloads()[0];
    assert!(!p.check_in_run, "{p:?}");
    assert_eq!(p.run.as_deref().unwrap(), ["python3", "main.py"]);
    assert!(p.check.as_deref().unwrap()[2].contains("compile("));
    m.shutdown(Duration::from_secs(10)).await;
}

/// Submit `n` default Python runs at once and wait for all; the pool's hits they made.
async fn burst(m: &RunManager, n: usize) -> u64 {
    let before = m.stats().pool.hits;
    let ids: Vec<String> = (0..n)
        .map(|_| m.submit(py("print(1)")).unwrap().run_id)
        .collect();
    for id in ids {
        let r = m.wait(&id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    }
    m.stats().pool.hits - before
}

#[tokio::test(start_paused = true)]
async fn a_burst_after_a_burst_finds_containers_ready_and_the_pool_shrinks_when_idle() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        pooled(&[("python", 1)])(c);
        c.runs.max_concurrent_runs = 8;
    });
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    // The floor was ready; more may be made while the burst is under way.
    let first = burst(&m, 8).await;
    assert!(first < 8, "the first burst found {first} of 8 ready");
    // The most runs in flight at once in the last minute: 8 (pool.default_max_ready).
    eventually(10, "the pool followed the burst", || idle(&m) == 8).await;
    assert_eq!(burst(&m, 8).await, 8, "the second burst found all ready");
    eventually(10, "refilled", || idle(&m) == 8).await;
    // A minute without demand: back to the floor.
    tokio::time::sleep(Duration::from_secs(61)).await;
    eventually(10, "shrunk", || idle(&m) == 1).await;
    assert_eq!(m.stats().pool.trimmed, 7);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn pool_max_ready_caps_what_demand_grows() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        pooled(&[("python", 1)])(c);
        c.pool.max_ready = BTreeMap::from([("python".to_string(), 3)]);
        c.runs.max_concurrent_runs = 8;
    });
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    burst(&m, 6).await;
    eventually(10, "the pool followed the burst up to its ceiling", || {
        idle(&m) == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(idle(&m), 3, "no more than pool.max_ready");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn no_container_is_started_ahead_of_time_while_runs_wait_for_a_slot() {
    // Filling competes with runs for the CPU: it waits until nobody waits.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Attach,
        Duration::from_millis(100),
    );
    let m = fake_manager(&fake, |c| {
        pooled(&[("python", 1)])(c);
        c.runs.max_concurrent_runs = 1;
    });
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let created = m.stats().pool.created;
    let ids: Vec<String> = (0..4)
        .map(|_| m.submit(py("print(1)")).unwrap().run_id)
        .collect();
    let mut saw_queue = false;
    while m.stats().queued > 0 {
        saw_queue = true;
        let s = m.stats().pool;
        assert_eq!(
            (s.stats.filling, s.created),
            (0, created),
            "a fill started while runs waited"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(saw_queue);
    for id in ids {
        m.wait(&id, Duration::from_secs(10)).await.unwrap();
    }
    eventually(10, "refilled once nobody waits", || idle(&m) >= 1).await;
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_queued_run_gets_the_memory_of_idle_containers_back() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        c.pool.sizes = BTreeMap::from([("bash".to_string(), 1)]);
        c.runs.memory_budget_mb = 1024;
    });
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    assert_eq!(m.stats().pool.stats.memory_mb, 512);
    // 1024 MB fits the budget only without the idle container.
    let mut req = py("print(1)");
    req.limits = limits(Some(1024.0), None);
    let run = m.submit(req).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(start_paused = true)]
async fn a_container_that_waited_too_long_is_replaced() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, |c| {
        c.pool.sizes = BTreeMap::from([("bash".to_string(), 1)]);
        c.pool.idle_seconds = 60;
    });
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let first = fake.specs()[0].name.clone();
    tokio::time::sleep(Duration::from_secs(61)).await;
    eventually(10, "replaced", || {
        idle(&m) == 1 && !fake.live_containers().contains(&first)
    })
    .await;
    assert_eq!(m.stats().pool.expired, 1);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn against_docker_a_pooled_run_gets_its_own_limits_and_a_fresh_container() {
    let m = docker_manager(pooled(&[("python", 1)]), None);
    m.start_pool();
    eventually(60, "a python container is ready", || idle(&m) == 1).await;
    // gVisor shows no cgroup tree; there MemTotal is the container's limit.
    let code = r#"import os
try:
    limit = int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read())
except OSError:
    limit = int(next(l for l in open('/proc/meminfo') if l.startswith('MemTotal')).split()[1]) * 1024
print(limit, len(os.listdir('.')))"#;
    let mut req = py(code);
    req.limits = limits(Some(256.0), None);
    let a = m.submit(req.clone()).unwrap();
    let a = m.wait(&a.run_id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(a.status, Status::Succeeded, "{a:?}");
    assert_eq!(
        a.stdout,
        format!("{} 1\n", 256u64 << 20),
        "only main.py is there"
    );
    let s = m.stats().pool;
    if crate::common::gvisor() {
        // runsc cannot change a started container's limits: the run got a new one.
        assert_eq!(s.misses, 1, "{s:?}");
    } else {
        assert_eq!(s.updated_hits + s.hits, 1, "{s:?}");
    }
    m.shutdown(Duration::from_secs(30)).await;
    m.executor().cleanup().drain(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn a_ready_container_found_dead_is_replaced_by_a_new_one_for_the_run() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_manager(&fake, pooled(&[("bash", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    // The pooled container ends without a word (as if killed from outside while it waited).
    fake.script(codebox::engine::fake::Behaviour::Raw(Vec::new()));
    let run = m.submit(request("bash", "echo hi")).unwrap();
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let s = m.stats().pool;
    assert_eq!((s.hits, s.failed), (1, 1), "{s:?}");
    assert!(
        fake.specs()
            .iter()
            .any(|s| s.labels["codebox.run"] == run.run_id),
        "a container was created for the run"
    );
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_run_that_needs_the_memory_of_containers_still_filling_starts_once_they_are_ready() {
    // Started fresh, the pool is still creating its containers when a run asks for the whole
    // budget: it must start as soon as they are ready (and given back), not wait for some
    // other run to come or go.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::CreateContainer,
        Duration::from_millis(300),
    );
    let m = fake_manager(&fake, |c| {
        pooled(&[("python", 2)])(c);
        c.runs.memory_budget_mb = 8192;
    });
    m.start_pool();
    assert_eq!(m.stats().pool.stats.filling, 2, "the pool is filling");
    let mut req = py("print(1)");
    req.limits = limits(Some(8192.0), None);
    let run = m.submit(req).unwrap();
    assert_eq!(
        run.status,
        Status::Queued,
        "the pool holds part of the budget"
    );
    let r = m.wait(&run.run_id, Duration::from_secs(20)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_queued_run_starts_when_a_pooled_container_fails_to_start() {
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(300),
    );
    fake.fail_at(codebox::engine::fake::Step::Start);
    let m = fake_manager(&fake, |c| {
        pooled(&[("python", 1)])(c);
        c.runs.memory_budget_mb = 1024;
    });
    m.start_pool();
    let mut req = py("print(1)");
    req.limits = limits(Some(1024.0), None);
    let run = m.submit(req).unwrap();
    assert_eq!(run.status, Status::Queued);
    // The pool's container fails; its memory comes back and the run starts (its own start
    // fails too, so it ends as a sandbox error, but it is no longer queued).
    let r = m.wait(&run.run_id, Duration::from_secs(20)).await.unwrap();
    assert_ne!(r.status, Status::Queued, "{}", r.message);
    assert_ne!(r.status, Status::Running, "{}", r.message);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn against_docker_a_burst_after_a_burst_finds_containers_ready() {
    let m = docker_manager(
        |c| {
            pooled(&[("python", 1)])(c);
            c.runs.max_concurrent_runs = 4;
        },
        None,
    );
    m.start_pool();
    eventually(60, "a python container is ready", || idle(&m) == 1).await;
    burst(&m, 4).await;
    eventually(120, "the pool followed the burst", || idle(&m) == 4).await;
    assert_eq!(burst(&m, 4).await, 4, "{:?}", m.stats().pool);
    m.shutdown(Duration::from_secs(30)).await;
    m.executor().cleanup().drain(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn against_docker_runs_with_other_limits_get_a_ready_container_of_their_class() {
    // Under runc the first two update a default container; under runsc (no updates) they get
    // new ones. Either way the third finds one made for its limits, and has them.
    let m = docker_manager(pooled(&[("python", 1)]), None);
    m.start_pool();
    eventually(60, "a python container is ready", || idle(&m) == 1).await;
    let code = r#"try:
    limit = int(open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read())
except OSError:
    limit = int(next(l for l in open('/proc/meminfo') if l.startswith('MemTotal')).split()[1]) * 1024
print(limit)"#;
    let mut req = py(code);
    req.limits = limits(Some(256.0), None);
    for _ in 0..2 {
        let r = m.submit(req.clone()).unwrap();
        let r = m.wait(&r.run_id, Duration::from_secs(60)).await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{r:?}");
    }
    // One default container stays; the rest are the class's. One or more: on a loaded host
    // (seen under runsc in CI) a fill takes longer than the 2 s the arrival rate is read
    // over, and the pool keeps one more than was in flight (see the next test).
    eventually(120, "a container of the class is ready", || idle(&m) >= 2).await;
    let hits = m.stats().pool.hits;
    let r = m.submit(req).unwrap();
    let r = m.wait(&r.run_id, Duration::from_secs(60)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{r:?}");
    assert_eq!(r.stdout, format!("{}\n", 256u64 << 20));
    assert_eq!(m.stats().pool.hits, hits + 1, "{:?}", m.stats().pool);
    m.shutdown(Duration::from_secs(30)).await;
    m.executor().cleanup().drain(Duration::from_secs(30)).await;
}

#[tokio::test]
async fn where_containers_are_slow_to_make_a_class_keeps_more_than_were_in_flight() {
    // The arrival rate asks for as many containers as arrive while one is made: a run in the
    // last 2 s and fills of 2.5 s or more ask for more. So "exactly one of the class is ready"
    // holds only where fills are fast (the Docker test above waited for that and timed out
    // on a loaded CI host under runsc).
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::CreateContainer,
        Duration::from_millis(2500),
    );
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(20, "ready", || idle(&m) == 1).await;
    let mut req = py("print(1)");
    req.limits = limits(Some(256.0), None);
    for _ in 0..2 {
        let run = m.submit(req.clone()).unwrap();
        let r = m.wait(&run.run_id, Duration::from_secs(30)).await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    }
    // Measured here: three of the class besides the default one (1280 MB in all).
    eventually(30, "more than one of the class is ready", || idle(&m) >= 3).await;
    let class = fake
        .specs()
        .iter()
        .filter(|s| s.labels["codebox.run"] == "pool" && s.memory_bytes == 256 << 20)
        .count();
    assert!(class >= 2, "{class} of the class made ahead of time");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_taken_container_is_replaced_once_its_run_ends_not_while_it_runs() {
    // Made while the run goes on, the replacement would take CPU from it (on 2 cores, Python
    // warm runs were 55 -> 72 ms): it is made once the run has ended.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Attach,
        Duration::from_millis(400),
    );
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    let run = m.submit(py("print(1)")).unwrap();
    eventually(10, "the run took the container", || {
        m.stats().pool.hits == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        m.stats().pool.created,
        1,
        "a replacement was made while the run was going on"
    );
    let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    eventually(10, "replaced after the run", || idle(&m) == 1).await;
    assert_eq!(m.stats().pool.created, 2);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn runs_sent_back_to_back_faster_than_containers_are_made_find_more_kept_ready() {
    // One client, one run in flight at a time: the peak in flight is 1, but each container
    // takes longer to make than a run lasts, so one ready container is not enough.
    let fake = Arc::new(FakeEngine::new());
    fake.delay(
        codebox::engine::fake::Step::Start,
        Duration::from_millis(300),
    );
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "ready", || idle(&m) == 1).await;
    for _ in 0..12 {
        let run = m.submit(py("print(1)")).unwrap();
        let r = m.wait(&run.run_id, Duration::from_secs(10)).await.unwrap();
        assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    }
    eventually(10, "more than one kept ready", || idle(&m) >= 2).await;
    assert!(idle(&m) <= 8, "pool.default_max_ready caps it");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_daemon_that_cannot_start_containers_is_not_asked_again_and_again() {
    // Seen with a runtime the daemon could not use: every failed fill started the next one
    // at once, about 20 a second, for as long as the server ran.
    let fake = Arc::new(FakeEngine::new());
    fake.fail_at(codebox::engine::fake::Step::Start);
    let m = fake_manager(&fake, pooled(&[("python", 1)]));
    m.start_pool();
    eventually(10, "a fill failed", || m.stats().pool.failed >= 1).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let failed = m.stats().pool.failed;
    assert!(
        failed <= 3,
        "{failed} fills in 2.5 s against a daemon that fails every start"
    );
    m.shutdown(Duration::from_secs(10)).await;
}
