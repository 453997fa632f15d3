//! Sessions' lifecycle on the fake engine: what each execution reports (count, state,
//! result), interrupt before reset, ends and what later calls are told, one execution at a
//! time, files, and that every container goes. The caps and memory a session holds are in
//! `sessions_budget.rs`, sessions opened ahead of time in `sessions_ready.rs`; the real thing
//! against Docker is in `sessions.rs`.

use std::sync::Arc;
use std::time::Duration;

use codebox::contract::{LimitsInput, RunRequest, SessionRequest};
use codebox::engine::fake::{exited, Behaviour, FakeEngine};
use codebox::report::{InterpreterState, ResetReason, Status};
use codebox::runs::SubmitError;

use crate::mcp_support::{eventually, fake_sessions};
use crate::sessions_support::{cell, open, run, state};

#[tokio::test]
async fn executions_count_keep_state_and_return_the_final_value() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    assert!(s.stateful);
    assert_eq!(s.language, "python");
    assert_eq!(fake.specs().len(), 1, "one container");
    assert_eq!(fake.specs()[0].labels["codebox.run"], "session");
    fake.script(exited(0, "hi\n"));
    fake.script(Behaviour::Result("42".into()));
    let first = run(&m, cell(&s, "print('hi')")).await;
    assert_eq!(first.status, Status::Succeeded, "{}", first.message);
    assert_eq!(first.stdout, "hi\n");
    assert_eq!(state(&first), (1, InterpreterState::New, None));
    assert_eq!(first.result, None);
    let second = run(&m, cell(&s, "x = 41\nx + 1")).await;
    assert_eq!(state(&second), (2, InterpreterState::Kept, None));
    assert_eq!(second.result.as_deref(), Some("42"));
    assert!(!second.result_truncated);
    assert_eq!(fake.specs().len(), 1, "still one container");
    let sent = fake.session_requests();
    assert_eq!(sent.len(), 2);
    assert!(sent[1]
        .iter()
        .any(|(k, v)| k == "cell" && v == b"x = 41\nx + 1"));
    m.close(&s.session_id).unwrap();
    eventually(10, "the container removed", || {
        fake.live_containers().is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_syntax_error_is_a_compile_error_and_keeps_the_state() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(exited(0, ""));
    fake.script(Behaviour::Syntax("SyntaxError: invalid syntax".into()));
    run(&m, cell(&s, "x = 1")).await;
    let r = run(&m, cell(&s, "x = (")).await;
    assert_eq!(r.status, Status::CompileError, "{}", r.message);
    assert!(r.compile.as_ref().unwrap().stderr.contains("SyntaxError"));
    assert_eq!(state(&r), (2, InterpreterState::Kept, None));
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_stop_interrupts_and_keeps_the_state_unless_the_driver_does_not_answer() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Hang {
        stdout: "working\n".into(),
    });
    fake.script(Behaviour::HangHard);
    fake.script(exited(0, ""));
    for (count, expect) in [
        (1, (InterpreterState::New, None)),
        (2, (InterpreterState::Reset, Some(ResetReason::Stopped))),
    ] {
        let id = m.submit(cell(&s, "while True: pass")).unwrap().run_id;
        eventually(10, "it runs", || {
            m.runs().report(&id).unwrap().status == Status::Running
        })
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = m.runs().stop(&id).await.unwrap();
        assert_eq!(r.status, Status::Stopped, "{}", r.message);
        assert_eq!(state(&r), (count, expect.0, expect.1));
    }
    let after = run(&m, cell(&s, "1")).await;
    assert_eq!(
        state(&after),
        (3, InterpreterState::New, None),
        "a fresh interpreter after the reset"
    );
    assert_eq!(fake.specs().len(), 1, "the session kept its container");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn an_out_of_memory_kill_resets_the_interpreter_not_the_session() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Signal {
        signal: 9,
        oom: true,
    });
    fake.script(exited(0, "fine\n"));
    let r = run(&m, cell(&s, "b = bytearray(10**10)")).await;
    assert_eq!(r.status, Status::OutOfMemory, "{}", r.message);
    assert_eq!(
        state(&r),
        (1, InterpreterState::Reset, Some(ResetReason::OutOfMemory))
    );
    let next = run(&m, cell(&s, "print('fine')")).await;
    assert_eq!(next.status, Status::Succeeded);
    assert_eq!(state(&next).1, InterpreterState::New);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_container_killed_whole_by_an_oom_ends_the_session_and_later_calls_say_so() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::KilledWhole { oom_event: true });
    let r = run(&m, cell(&s, "b = bytearray(10**10)")).await;
    assert_eq!(r.status, Status::OutOfMemory, "{}", r.message);
    let err = m.submit(cell(&s, "1")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "session_id: session {} ended: out of memory; create a new one",
            s.session_id
        )
    );
    eventually(10, "the container removed", || {
        fake.live_containers().is_empty()
    })
    .await;
    assert_eq!(m.stats().sessions.memory_mb, 0, "its memory is back");
}

#[tokio::test(start_paused = true)]
async fn an_idle_session_expires_and_later_calls_are_told_how_long_it_waited() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m
        .create(SessionRequest {
            idle_timeout_seconds: Some(30.0),
            ..open("python")
        })
        .await
        .unwrap();
    assert_eq!(s.idle_timeout_seconds, 30);
    tokio::time::sleep(Duration::from_secs(20)).await;
    run(&m, cell(&s, "1")).await;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(m.list().sessions.len(), 1, "a call restarted its clock");
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(m.list().sessions.is_empty());
    let err = m.submit(cell(&s, "1")).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "session_id: session {} expired after 30 s idle; create a new one",
            s.session_id
        )
    );
    let closed = m.close(&s.session_id).unwrap();
    assert!(
        closed.closed,
        "an ended session is closed: closing it is not an error"
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_ends_at_its_maximum_lifetime_even_when_busy() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |c| c.sessions.max_lifetime_seconds = 120);
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Hang {
        stdout: String::new(),
    });
    let mut forever = cell(&s, "while True: pass");
    forever.limits = Some(LimitsInput {
        timeout_seconds: Some(600.0),
        ..Default::default()
    });
    let busy = m.submit(forever).unwrap().run_id;
    let queued = m.submit(cell(&s, "print(1)")).unwrap().run_id;
    tokio::time::sleep(Duration::from_secs(121)).await;
    let r = m.runs().wait(&busy, Duration::from_secs(30)).await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{}", r.message);
    let q = m
        .runs()
        .wait(&queued, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(q.status, Status::Stopped);
    assert!(
        q.message.contains("reached its maximum lifetime of 120 s"),
        "{}",
        q.message
    );
    let err = m.submit(cell(&s, "1")).unwrap_err().to_string();
    assert!(err.contains("maximum lifetime of 120 s"), "{err}");
}

#[tokio::test]
async fn what_a_session_fixes_cannot_be_asked_per_execution() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    let field = |req: RunRequest| match m.submit(req).unwrap_err() {
        SubmitError::Invalid(e) => e.field,
        other => panic!("{other}"),
    };
    let mut r = cell(&s, "1");
    r.limits = Some(LimitsInput {
        memory_mb: Some(1024.0),
        ..Default::default()
    });
    assert_eq!(field(r), "limits.memory_mb");
    let mut r = cell(&s, "1");
    r.tests = Some(vec![Default::default()]);
    assert_eq!(field(r), "tests");
    let mut r = cell(&s, "1");
    r.args = Some(vec!["a".into()]);
    assert_eq!(field(r), "args", "no program to pass arguments to");
    let mut r = cell(&s, "1");
    r.language = "ruby".into();
    assert_eq!(field(r), "language");
    let mut r = cell(&s, "1");
    r.language = "py".into();
    m.submit(r).expect("the session's own language, by alias");
    let unknown = RunRequest {
        session_id: Some("cbx_0000".into()),
        ..cell(&s, "1")
    };
    assert_eq!(
        m.submit(unknown).unwrap_err().to_string(),
        "session_id: unknown session cbx_0000"
    );
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn executions_of_one_session_run_one_at_a_time_in_arrival_order() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Hang {
        stdout: String::new(),
    });
    let first = m.submit(cell(&s, "a")).unwrap().run_id;
    eventually(10, "the first cell reached the container", || {
        fake.session_requests().len() == 1
    })
    .await;
    let second = m.submit(cell(&s, "b")).unwrap();
    assert_eq!(second.status, Status::Queued);
    // A run of its own still starts: the session's queue holds up nobody else.
    let other = m
        .submit(RunRequest {
            language: "python".into(),
            code: "print(1)".into(),
            ..Default::default()
        })
        .unwrap();
    m.runs()
        .wait(&other.run_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        m.runs().report(&second.run_id).unwrap().status,
        Status::Queued
    );
    m.runs().stop(&first).await.unwrap();
    let r = m
        .runs()
        .wait(&second.run_id, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let cells: Vec<Vec<u8>> = fake
        .session_requests()
        .into_iter()
        .filter_map(|rec| rec.into_iter().find(|(k, _)| k == "cell").map(|(_, v)| v))
        .collect();
    assert_eq!(cells, [b"a".to_vec(), b"b".to_vec()]);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn closing_a_session_stops_what_is_queued_and_removes_its_container() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Hang {
        stdout: String::new(),
    });
    let running = m.submit(cell(&s, "a")).unwrap().run_id;
    let queued = m.submit(cell(&s, "b")).unwrap().run_id;
    eventually(10, "it runs", || {
        m.runs().report(&running).unwrap().status == Status::Running
    })
    .await;
    let closed = m.close(&s.session_id).unwrap();
    assert_eq!((closed.executions, closed.closed), (2, true));
    let q = m
        .runs()
        .wait(&queued, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(q.status, Status::Stopped);
    assert!(q.message.contains("was closed"), "{}", q.message);
    let r = m
        .runs()
        .wait(&running, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Stopped);
    eventually(10, "the container removed", || {
        fake.live_containers().is_empty()
    })
    .await;
    assert_eq!(
        m.submit(cell(&s, "c")).unwrap_err().to_string(),
        format!("session_id: session {} was closed", s.session_id)
    );
}

#[tokio::test]
async fn files_only_sessions_run_the_program_each_time_and_never_reset() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("perl")).await.unwrap();
    assert!(!s.stateful, "perl has no session driver");
    let mut req = cell(&s, "print 'hi'");
    req.args = Some(vec!["x".into()]);
    let r = run(&m, req).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!(state(&r).1, InterpreterState::New);
    let r = run(&m, cell(&s, "print 'again'")).await;
    assert_eq!(state(&r).1, InterpreterState::Kept);
    let sent = fake.session_requests();
    assert!(sent[0]
        .iter()
        .any(|(k, v)| k == "run" && v.ends_with(b"x\0")));
    assert!(sent[0].iter().any(|(k, _)| k == "file"), "the source file");
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn a_session_file_is_read_without_running_anything() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    let f = m.read(&s.session_id, "data.txt", 0, None).await.unwrap();
    match f {
        codebox::sessions::SessionFile::File {
            size_bytes,
            content,
            ..
        } => {
            assert_eq!(size_bytes, 4);
            assert_eq!(content, b"fake");
        }
        other => panic!("{other:?}"),
    }
    let err = m
        .read(&s.session_id, "../etc/passwd", 0, None)
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("path:"), "{err}");
    m.shutdown(Duration::from_secs(10)).await;
    eventually(10, "shutdown removes the session", || {
        fake.live_containers().is_empty()
    })
    .await;
}

#[tokio::test]
async fn reading_a_file_while_an_execution_runs_is_answered_at_once() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Hang {
        stdout: String::new(),
    });
    let id = m.submit(cell(&s, "while True: pass")).unwrap().run_id;
    eventually(10, "it runs", || {
        m.runs().report(&id).unwrap().status == Status::Running
    })
    .await;
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        m.read(&s.session_id, "data.txt", 0, None),
    )
    .await
    .expect("the read waited behind the running execution");
    let err = read.unwrap_err().to_string();
    assert!(err.contains("is busy: an execution is running"), "{err}");
    let r = m.runs().stop(&id).await.unwrap();
    assert_eq!(r.status, Status::Stopped);
    m.shutdown(Duration::from_secs(10)).await;
}

/// After a stop or a timeout `codebox-init` answers once the interrupt's grace passed, what
/// the cell left is killed and the driver started again, which may take the driver's whole
/// start limit: the host waits that long (its deadlines follow from what it told
/// `codebox-init`), so the execution is `stopped` or `timed_out` and the session goes on.
#[tokio::test(start_paused = true)]
async fn a_driver_restart_within_its_start_limit_keeps_the_session_after_a_stop_or_timeout() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    let times = codebox::executor::session::SESSION_TIMES;
    let restart = times.driver_start - Duration::from_secs(1);
    fake.script(Behaviour::Slow {
        after: times.interrupt + Duration::from_secs(2) + restart,
        then: Box::new(Behaviour::HangHard),
    });
    let id = m.submit(cell(&s, "while True: pass")).unwrap().run_id;
    eventually(10, "the cell was sent", || {
        fake.session_requests().len() == 1
    })
    .await;
    let r = m.runs().stop(&id).await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{}", r.message);
    assert_eq!(
        state(&r),
        (1, InterpreterState::Reset, Some(ResetReason::Stopped))
    );
    let mut req = cell(&s, "while True: pass");
    req.limits = Some(LimitsInput {
        timeout_seconds: Some(1.0),
        ..Default::default()
    });
    let check = Duration::from_secs(30); // at most the language's check limit
    fake.script(Behaviour::Slow {
        after: check + Duration::from_secs(1) + times.interrupt + Duration::from_secs(2) + restart,
        then: Box::new(Behaviour::TimedOut {
            stdout: String::new(),
        }),
    });
    let id = m.submit(req).unwrap().run_id;
    let r = m.runs().wait(&id, Duration::from_secs(300)).await.unwrap();
    assert_eq!(r.status, Status::TimedOut, "{}", r.message);
    let after = run(&m, cell(&s, "1")).await;
    assert_eq!(
        after.status,
        Status::Succeeded,
        "the session lives: {}",
        after.message
    );
    m.shutdown(Duration::from_secs(10)).await;
}

/// A read whose caller went away before its answer is still read to its end: the next
/// execution gets its own answer, not the read's frames.
#[tokio::test(start_paused = true)]
async fn a_read_whose_caller_went_away_leaves_the_next_execution_its_own_answer() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.slow_reads(Duration::from_secs(5));
    let gone = tokio::time::timeout(
        Duration::from_secs(1),
        m.read(&s.session_id, "data.txt", 0, None),
    )
    .await;
    assert!(gone.is_err(), "the caller went away before the answer");
    fake.slow_reads(Duration::ZERO);
    fake.script(Behaviour::Result("42".into()));
    let r = run(&m, cell(&s, "6 * 7")).await;
    assert_eq!(
        (r.status, r.result.as_deref()),
        (Status::Succeeded, Some("42")),
        "{}",
        r.message
    );
    let f = m
        .read(&s.session_id, "data.txt", 0, None)
        .await
        .expect("the session still reads");
    assert!(
        matches!(f, codebox::sessions::SessionFile::File { .. }),
        "{f:?}"
    );
    m.shutdown(Duration::from_secs(10)).await;
}

/// Closing a session whose cell does not answer removes its container at once: no
/// interrupt's grace, no driver started again; the execution under way ends `stopped`.
#[tokio::test(start_paused = true)]
async fn closing_a_session_with_a_stuck_cell_removes_its_container_at_once() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    fake.script(Behaviour::Slow {
        after: Duration::from_secs(33),
        then: Box::new(Behaviour::HangHard),
    });
    let running = m.submit(cell(&s, "while True: pass")).unwrap().run_id;
    eventually(10, "the cell was sent", || {
        fake.session_requests().len() == 1
    })
    .await;
    m.close(&s.session_id).unwrap();
    eventually(
        5,
        "the container is removed at once, not after the interrupt and a driver restart",
        || fake.live_containers().is_empty(),
    )
    .await;
    let r = m
        .runs()
        .wait(&running, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(r.status, Status::Stopped, "{}", r.message);
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn closing_a_session_twice_answers_the_same() {
    let fake = Arc::new(FakeEngine::new());
    let m = fake_sessions(&fake, |_| {});
    let s = m.create(open("python")).await.unwrap();
    run(&m, cell(&s, "1")).await;
    let first = m.close(&s.session_id).unwrap();
    let second = m.close(&s.session_id);
    assert_eq!(
        second.as_ref().map_err(|e| e.to_string()),
        Ok(&first),
        "close_session is idempotent"
    );
    assert_eq!((first.executions, first.closed), (1, true));
    m.shutdown(Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_opened_as_the_server_shuts_down_is_removed_not_kept() {
    // Between create_session's last look at the shutdown flag and its entry in the table, a
    // shutdown could pass and leave its container to the next start's reaper. The look and
    // the entry are now one step under the table's lock; this runs the race many times.
    for round in 0..40 {
        let fake = Arc::new(FakeEngine::new());
        let m = fake_sessions(&fake, |c| c.sessions.ready.clear());
        let opening = {
            let m = m.clone();
            tokio::spawn(async move { m.create(open("python")).await })
        };
        // Let the create reach its container now and then, not always.
        for _ in 0..(round % 7) {
            tokio::task::yield_now().await;
        }
        m.shutdown(Duration::from_secs(10)).await;
        let created = opening.await.unwrap();
        eventually(10, "no session container outlives shutdown", || {
            fake.live_containers().is_empty()
        })
        .await;
        if let Ok(s) = created {
            assert!(
                m.list().sessions.is_empty(),
                "round {round}: {} is still listed after shutdown",
                s.session_id
            );
        }
        assert_eq!(m.stats().sessions.memory_mb, 0, "round {round}");
    }
}
