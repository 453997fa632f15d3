//! The history's unit tests: code policy, the queue's bounds, instances, ordering.

use super::*;

fn limits() -> RunLimits {
    RunLimits {
        memory_mb: 512,
        timeout_seconds: 30.0,
        cpus: 1.0,
    }
}

#[test]
fn code_preview_follows_the_policy() {
    let code = "é".repeat(600);
    assert_eq!(code_preview(&code, CodePolicy::None), None);
    assert_eq!(
        code_preview(&code, CodePolicy::Preview)
            .unwrap()
            .chars()
            .count(),
        500
    );
    assert_eq!(code_preview(&code, CodePolicy::Full).unwrap(), code);
    assert_eq!(
        sha256_hex("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
}

fn new_run(id: &str, instance: &str) -> NewRun {
    NewRun::new(
        id,
        "python",
        limits(),
        "print(1)",
        CodePolicy::Preview,
        instance,
    )
}

#[tokio::test]
async fn rows_of_an_instance_whose_lock_file_says_dead_are_marked_interrupted_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite3");
    let owner = |i: &str| Owner {
        instance: i.to_string(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let old = crate::instance::Instance::register(dir.path());
    let h = History::open(&path, owner(&old.id));
    h.insert(new_run("r1", &old.id));
    h.insert(new_run("r2", &old.id));
    h.started("r2");
    assert_eq!(h.query(Query::default()).await.unwrap().len(), 2);
    // Alive (it holds its lock): a second process leaves its rows alone, though the
    // heartbeat is fresh either way.
    let other = History::open(&path, owner("other"));
    assert!(other
        .query(Query::default())
        .await
        .unwrap()
        .iter()
        .all(|r| r.status != Status::SandboxError));
    // It crashes: its lock file stays, unlocked, and the next open knows at once.
    old.keep_lock_file();
    drop(old);
    drop(h);
    let h = History::open(&path, owner("new"));
    let rows = h.query(Query::default()).await.unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r.status, Status::SandboxError);
        assert_eq!(r.message, INTERRUPTED_MESSAGE);
        assert!(r.ended_at.is_some());
        // Its report is stored too, for get_result on any server.
        let report = h.report(&r.run_id, None).await.unwrap().unwrap();
        assert_eq!(
            (report.status, report.message.as_str(), report.limits),
            (Status::SandboxError, INTERRUPTED_MESSAGE, limits())
        );
    }
}

#[test]
fn without_a_lock_file_an_instance_is_judged_by_its_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let owner = |i: &str| Owner {
        instance: i.to_string(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let mut db = sqlite::Sqlite::in_memory().unwrap();
    store::prepare(&mut db, &owner("me"), true, false).unwrap();
    let now = db.now_ms().unwrap();
    let expiry = INSTANCE_EXPIRY.as_millis() as i64;
    // Another host's server, heard from a moment ago; one silent for longer than the
    // expiry; one that never sent a heartbeat (a codebox from before heartbeats).
    store::heartbeat(&mut db, &owner("fresh"), now - 5_000, false).unwrap();
    store::heartbeat(&mut db, &owner("silent"), now - expiry - 1, false).unwrap();
    for (run, instance) in [
        ("a", "fresh"),
        ("b", "silent"),
        ("c", "legacy"),
        ("d", "me"),
    ] {
        store::insert(&mut db, &new_run(run, instance)).unwrap();
    }
    for (id, instance) in [("s-silent", "silent"), ("s-fresh", "fresh")] {
        let s = SessionOpened {
            session_id: id.into(),
            language: "python".into(),
            instance: instance.into(),
            created_at_ms: now,
        };
        sessions::opened(&mut db, &s).unwrap();
    }
    // Right after this server's own connection came back, leases are not judged: the others
    // may have been cut off too.
    assert_eq!(
        store::mark_interrupted(&mut db, &owner("me"), now, false).unwrap(),
        0
    );
    assert_eq!(
        store::mark_interrupted(&mut db, &owner("me"), now, true).unwrap(),
        2
    );
    let ended =
        |db: &mut sqlite::Sqlite, id: &str| sessions::lookup(db, id).unwrap().unwrap().ended;
    assert_eq!(
        ended(&mut db, "s-silent").as_deref(),
        Some(SESSION_SERVER_STOPPED)
    );
    assert_eq!(ended(&mut db, "s-fresh"), None);
    let status = |db: &mut sqlite::Sqlite, id: &str| store::get(db, id).unwrap().unwrap().status;
    assert_eq!(
        status(&mut db, "a"),
        Status::Queued,
        "alive on another host"
    );
    assert_eq!(status(&mut db, "b"), Status::SandboxError);
    assert_eq!(status(&mut db, "c"), Status::SandboxError);
    // A lapsed lease stopped answering; no heartbeat at all is an old codebox, restarted.
    let message = |db: &mut sqlite::Sqlite, id: &str| store::get(db, id).unwrap().unwrap().message;
    assert_eq!(message(&mut db, "b"), STOPPED_ANSWERING_MESSAGE);
    assert_eq!(message(&mut db, "c"), INTERRUPTED_MESSAGE);
    assert_eq!(status(&mut db, "d"), Status::Queued, "our own");
    let w = store::whereabouts(&mut db, "a").unwrap().unwrap();
    assert_eq!((w.instance.as_str(), w.status), ("fresh", Status::Queued));
    assert_eq!(w.host, Some(crate::instance::hostname()));
    assert!(w.last_seen_ms_ago.unwrap() >= 5_000);
    assert_eq!(store::whereabouts(&mut db, "nope").unwrap(), None);
}

#[test]
fn a_lapsed_server_is_fenced_its_late_report_dropped_and_it_rejoins() {
    let dir = tempfile::tempdir().unwrap();
    let owner = |i: &str| Owner {
        instance: i.to_string(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let mut db = sqlite::Sqlite::in_memory().unwrap();
    store::prepare(&mut db, &owner("judge"), true, false).unwrap();
    let now = db.now_ms().unwrap();
    let lease = INSTANCE_EXPIRY.as_millis() as i64;
    store::heartbeat(&mut db, &owner("paused"), now - lease - 1, false).unwrap();
    store::insert(&mut db, &new_run("r", "paused")).unwrap();
    store::started(&mut db, "r", now - lease).unwrap();
    // A renewal in time wins over a judge that comes after it: nothing is marked.
    store::heartbeat(&mut db, &owner("paused"), now, true).unwrap();
    assert_eq!(
        store::mark_interrupted(&mut db, &owner("judge"), now, true).unwrap(),
        0
    );
    // Silent past the lease: judged; its renewal then fails until it re-joins.
    let later = now + lease + 1;
    assert_eq!(
        store::mark_interrupted(&mut db, &owner("judge"), later, true).unwrap(),
        1
    );
    assert!(!store::heartbeat(&mut db, &owner("paused"), later, true).unwrap());
    assert!(!store::heartbeat(&mut db, &owner("paused"), later + 1, true).unwrap());
    // Its late report does not replace the judge's.
    store::finish(&mut db, &report("r", "late\n"), later).unwrap();
    let row = store::get(&mut db, "r").unwrap().unwrap();
    assert_eq!(
        (row.status, row.message.as_str()),
        (Status::SandboxError, STOPPED_ANSWERING_MESSAGE)
    );
    let kept = store::stored_report(&mut db, "r", None).unwrap().unwrap();
    assert!(!kept.contains(r#""stdout":"late"#), "{kept}");
    store::rejoin(&mut db, &owner("paused")).unwrap();
    assert!(store::heartbeat(&mut db, &owner("paused"), later + 2, true).unwrap());
    // A run that ends once keeps its report.
    store::insert(&mut db, &new_run("s", "judge")).unwrap();
    store::finish(&mut db, &report("s", "first\n"), later).unwrap();
    store::finish(&mut db, &report("s", "second\n"), later).unwrap();
    let kept = store::stored_report(&mut db, "s", None).unwrap().unwrap();
    assert!(kept.contains(r#""stdout":"first\n""#), "{kept}");
}

#[test]
fn runs_accepted_in_the_same_millisecond_list_the_later_first() {
    let mut db = sqlite::Sqlite::in_memory().unwrap();
    schema::migrate(&mut db).unwrap();
    for id in ["z", "a", "m"] {
        let mut r = new_run(id, "x");
        r.created_at_ms = 1000;
        store::insert(&mut db, &r).unwrap();
    }
    let ids: Vec<String> = store::select(&mut db, &Query::default())
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect();
    assert_eq!(ids, ["m", "a", "z"]);
}

fn report(run_id: &str, stdout: &str) -> RunReport {
    let mut r = RunReport::new(
        run_id,
        "python",
        Status::Succeeded,
        limits(),
        "exited with code 0",
    );
    r.stage = Some(Stage::Run);
    r.exit_code = Some(0);
    r.stdout = stdout.to_string();
    r.stdout_bytes = stdout.len() as u64;
    r.duration_ms = 5;
    r
}

#[tokio::test]
async fn full_reports_are_stored_at_the_end_and_cleared_by_id_or_age() {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(
        &dir.path().join("h.sqlite3"),
        Owner {
            instance: "x".into(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        },
    );
    for id in ["r1", "r2", "r3"] {
        h.insert(NewRun::new(
            id,
            "python",
            limits(),
            "print(1)",
            CodePolicy::Preview,
            "x",
        ));
    }
    assert_eq!(h.report("r1", None).await.unwrap(), None, "not ended yet");
    for id in ["r1", "r2", "r3"] {
        h.finish(Arc::new(report(id, &format!("out of {id}\n"))));
    }
    assert_eq!(
        h.report("r1", None).await.unwrap(),
        Some(report("r1", "out of r1\n"))
    );
    assert_eq!(h.report("nope", None).await.unwrap(), None);
    let later = now_ms() + 60_000;
    assert_eq!(
        h.report("r1", Some(later)).await.unwrap(),
        None,
        "ended too long ago"
    );
    h.forget_reports(vec!["r1".into()]);
    assert_eq!(h.report("r1", None).await.unwrap(), None);
    assert!(h.report("r2", None).await.unwrap().is_some());
    h.forget_reports_ended_before(later);
    assert_eq!(h.report("r2", None).await.unwrap(), None);
    assert_eq!(h.report("r3", None).await.unwrap(), None);
    let row = h.get("r2").await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.stdout_bytes),
        (Status::Succeeded, 10),
        "metadata stays"
    );
}

#[tokio::test]
async fn reports_waiting_for_a_stalled_database_are_bounded_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("h.sqlite3");
    let owner = Owner {
        instance: "x".into(),
        data_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let bounds = QueueBounds {
        commands: 4096,
        bytes: 4 << 20,
    };
    let h = History::start(&HistoryStore::Sqlite(path.clone()), owner, bounds);
    h.query(Query::default()).await.unwrap();
    // Another connection holds the write lock: the history thread waits in its first
    // write (up to the busy timeout) while reports of 1 MB each arrive.
    let lock = rusqlite::Connection::open(&path).unwrap();
    lock.execute_batch("BEGIN EXCLUSIVE").unwrap();
    h.insert(new_run("r0", "x"));
    let reports: Vec<Arc<RunReport>> = (0..20)
        .map(|i| Arc::new(report(&format!("r{i}"), &"x".repeat(1 << 20))))
        .collect();
    for r in &reports {
        h.finish(r.clone());
    }
    let held = reports.iter().filter(|r| Arc::strong_count(r) > 1).count();
    assert!(
        (1..=4).contains(&held),
        "{held} reports of 1 MB wait in a 4 MB queue"
    );
    lock.execute_batch("COMMIT").unwrap();
    assert!(h.flush(Duration::from_secs(30)).await);
    // The flush answers before its own weight is taken off: wait for that too.
    let drained = std::time::Instant::now();
    while h.queued_bytes.load(std::sync::atomic::Ordering::SeqCst) != 0 {
        assert!(
            drained.elapsed() < Duration::from_secs(5),
            "the queue never drained"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Once it caught up, writes are taken again.
    h.insert(new_run("r19", "x"));
    h.finish(reports[19].clone());
    assert!(h.report("r19", None).await.unwrap().is_some());
}

#[tokio::test]
async fn an_unopenable_database_answers_unavailable_and_drops_writes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a folder").unwrap();
    let h = History::open(
        &file.join("history.sqlite3"),
        Owner {
            instance: "x".into(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        },
    );
    h.insert(NewRun::new(
        "r1",
        "python",
        limits(),
        "print(1)",
        CodePolicy::Preview,
        "x",
    ));
    let err = h.query(Query::default()).await.unwrap_err();
    assert!(matches!(err, HistoryError::Unavailable { .. }), "{err}");
    assert!(
        h.flush(Duration::from_secs(5)).await,
        "a flush answers even without a database"
    );
}

#[test]
fn a_session_is_found_by_a_prefix_of_its_id_and_wildcards_are_plain_characters() {
    let mut db = sqlite::Sqlite::in_memory().unwrap();
    schema::migrate(&mut db).unwrap();
    for id in ["cbx_ab12", "cbx_ab34", "cbx_cd56"] {
        sessions::opened(
            &mut db,
            &SessionOpened {
                session_id: id.into(),
                language: "python".into(),
                instance: "me".into(),
                created_at_ms: 1,
            },
        )
        .unwrap();
    }
    // A run may name a session the sessions table does not hold (another server's).
    store::insert(&mut db, &new_run("r", "x").in_session("cbx_ef78", 1)).unwrap();
    let ids = |db: &mut sqlite::Sqlite, p: &str| sessions::ids_starting_with(db, p, 10).unwrap();
    assert_eq!(ids(&mut db, "cbx_ab"), ["cbx_ab12", "cbx_ab34"]);
    assert_eq!(ids(&mut db, "cbx_c"), ["cbx_cd56"]);
    assert_eq!(ids(&mut db, "cbx_ef"), ["cbx_ef78"]);
    assert_eq!(ids(&mut db, "cbx_ab12"), ["cbx_ab12"]);
    assert!(
        ids(&mut db, "CBX_AB").is_empty(),
        "ids are compared exactly"
    );
    assert!(ids(&mut db, "cbx%").is_empty() && ids(&mut db, "cbx__b").is_empty());
    assert_eq!(
        sessions::ids_starting_with(&mut db, "cbx_", 2)
            .unwrap()
            .len(),
        2
    );
}
