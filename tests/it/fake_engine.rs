//! Control-flow corner cases against the fake engine: what was asked of the engine (specs,
//! payloads, signals), that every path removes what it created, and the stage logic's
//! deadlines with paused time. Request rejections, which never reach an engine, are in
//! `validation.rs`.

use std::sync::Arc;
use std::time::Duration;

use codebox::config::Config;
use codebox::contract::{FileInput, LimitsInput, RunRequest};
use codebox::engine::fake::{exited, Behaviour, FakeEngine, Step};
use codebox::engine::protocol::{frame, EntryKind};
use codebox::engine::{ContainerEngine, Signal};
use codebox::executor::{new_run_id, Executor};
use codebox::report::{Stage, Status};
use tokio_util::sync::CancellationToken;

use crate::common::{limits, request, valid};
use crate::mcp_support::eventually;

fn executor(fake: &Arc<FakeEngine>) -> Executor {
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    Executor::new(engine, Arc::new(Config::default()), "fake-instance".into())
}

async fn run(fake: &Arc<FakeEngine>, req: RunRequest) -> codebox::report::RunReport {
    executor(fake)
        .execute(&new_run_id(), &valid(req), 0, CancellationToken::new())
        .await
}

async fn wait_until_clean(fake: &FakeEngine) {
    for _ in 0..250 {
        if fake.live_containers().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("left behind: containers {:?}", fake.live_containers());
}

#[tokio::test]
async fn every_container_spec_is_locked_down() {
    let fake = Arc::new(FakeEngine::new());
    let r = run(&fake, request("cpp", "int main(){}")).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let specs = fake.specs();
    assert_eq!(specs.len(), 2, "a compile and a run container");
    for s in &specs {
        assert_eq!(s.network_mode, "none");
        assert!(s.readonly_rootfs);
        let uid: u32 = s.user.split(':').next().unwrap().parse().unwrap();
        assert!((10001..=10064).contains(&uid), "{}", s.user);
        assert_eq!(s.cap_drop, ["ALL"]);
        assert!(!s.privileged && !s.init);
        assert_eq!(s.cmd, ["/usr/local/bin/codebox-init"]);
        assert!(s.security_opt.contains(&"no-new-privileges".to_string()));
        assert_eq!(s.pids_limit, 256);
        assert_eq!(s.memory_bytes, s.memory_swap_bytes);
        assert!(s.tmpfs["/tmp"].contains("noexec"));
        assert!(s.tmpfs["/workspace"].contains("nosuid"));
        assert_eq!(s.labels["codebox.managed"], "true");
        assert_eq!(s.labels["codebox.run"], r.run_id);
        assert_eq!(s.labels["codebox.instance"], "fake-instance");
        assert_eq!(s.env.len(), 4, "minimal environment: {:?}", s.env);
        assert_eq!(s.runtime, "runc");
    }
    assert_ne!(
        specs[0].user, specs[1].user,
        "each container runs as a uid of its own"
    );
    let (compile, run) = (&specs[0], &specs[1]);
    assert_eq!(compile.memory_bytes, 1024 * 1024 * 1024);
    assert!(compile.tmpfs["/workspace"].contains("size=256m"));
    assert_eq!(run.memory_bytes, 512 * 1024 * 1024);
    assert!(run.tmpfs["/workspace"].contains("size=64m"));
    assert_eq!((run.cpu_quota_us, run.cpu_period_us), (100_000, 100_000));
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn the_payload_carries_the_command_files_stdin_and_the_limits() {
    let fake = Arc::new(FakeEngine::new());
    let req = RunRequest {
        stdin: Some("in".into()),
        args: Some(vec!["a1".into(), "".into()]),
        files: Some(vec![FileInput {
            path: "data/x.txt".into(),
            content: "x".into(),
            encoding: None,
        }]),
        limits: Some(LimitsInput {
            timeout_seconds: Some(5.0),
            ..Default::default()
        }),
        ..request("python", "print(1)")
    };
    let r = run(&fake, req).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    assert_eq!(fake.specs().len(), 1, "python checks in its run container");
    let p = &fake.payloads()[0];
    // Python checks and runs in one interpreter: its checked run, the args after it.
    let run = p.run.as_deref().unwrap();
    assert_eq!(
        (run[0].as_str(), run[1].as_str(), &run[3..]),
        (
            "python3",
            "-c",
            &["main.py", "a1", ""].map(String::from)[..]
        )
    );
    assert!(
        run[2].contains("compile(") && run[2].contains("compiled"),
        "{run:?}"
    );
    assert!(p.check_in_run && p.check.is_none(), "{p:?}");
    assert_eq!(p.check_timeout, Duration::from_secs(30));
    assert_eq!(p.env["PYTHONDONTWRITEBYTECODE"], "1");
    assert_eq!(p.timeout, Duration::from_secs(5));
    assert_eq!(p.stdin.as_deref(), Some(&b"in"[..]));
    let entries = p.files.entries();
    let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
    assert_eq!(paths, ["main.py", "data/x.txt"]);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn compile_artifacts_reach_the_run_stage_whole() {
    let fake = Arc::new(FakeEngine::new());
    let r = run(&fake, request("cpp", "int main(){}")).await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let payloads = fake.payloads();
    assert_eq!(payloads.len(), 2);
    let entries = payloads[1].files.entries();
    let binary = entries
        .iter()
        .find(|e| e.path == "main")
        .expect("the compiled binary reaches the run stage");
    assert_eq!((binary.kind, binary.mode), (EntryKind::File, 0o755));
    assert!(entries.iter().any(|e| e.path == "main.cpp"));
    assert_eq!(r.compile.as_ref().unwrap().status, Status::Succeeded);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn compile_failure_ends_the_run_and_its_prepared_container_is_removed() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::Exit {
        code: 1,
        stdout: String::new(),
        stderr: "main.cpp:1: error".into(),
    });
    let r = run(&fake, request("cpp", "int main(")).await;
    assert_eq!(
        (r.status, r.stage, r.exit_code),
        (Status::CompileError, Some(Stage::Compile), Some(1))
    );
    assert_eq!(r.compile.unwrap().stderr, "main.cpp:1: error");
    assert_eq!(fake.attached(), 1, "the run container was never used");
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn a_failed_check_is_a_compile_error_from_the_run_container() {
    let fake = Arc::new(FakeEngine::new());
    let mut frames = frame(b'P', b"check");
    frames.extend(frame(b'E', b"SyntaxError: invalid syntax"));
    frames.extend(frame(
        b'X',
        b"phase=check\nend=exited\ncode=1\ncpu_ms=12\npeak_kb=9000\n",
    ));
    frames.extend(frame(b'Z', b""));
    fake.script(Behaviour::Raw(frames));
    let r = run(&fake, request("python", "print(")).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile))
    );
    let c = r.compile.unwrap();
    assert_eq!(c.stderr, "SyntaxError: invalid syntax");
    assert_eq!(c.usage.cpu_time_ms, Some(12));
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn a_check_that_fails_in_the_programs_own_process_is_a_compile_error() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::Syntax(
        "SyntaxError: '(' was never closed\n".into(),
    ));
    let r = run(&fake, request("python", "print(")).await;
    assert_eq!(
        (r.status, r.stage),
        (Status::CompileError, Some(Stage::Compile)),
        "{}",
        r.message
    );
    assert_eq!(
        r.message,
        "the syntax check failed with exit code 1; the compiler's output is in compile.stderr"
    );
    let c = r.compile.unwrap();
    assert_eq!(c.stderr, "SyntaxError: '(' was never closed\n");
    assert_eq!(c.status, Status::CompileError);
    assert!(fake.payloads()[0].check_in_run);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn containers_removed_when_create_fails() {
    let fake = Arc::new(FakeEngine::new());
    fake.fail_at(Step::CreateContainer);
    let r = run(&fake, request("python", "print(1)")).await;
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message.contains("creating the container failed"),
        "{}",
        r.message
    );
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn container_removed_when_attach_or_start_fails() {
    for (step, words) in [
        (Step::Attach, "attaching to the container failed"),
        (Step::Start, "starting the container failed"),
    ] {
        let fake = Arc::new(FakeEngine::new());
        fake.fail_at(step);
        let r = run(&fake, request("python", "print(1)")).await;
        assert_eq!(r.status, Status::SandboxError);
        assert!(r.message.contains(words), "{}", r.message);
        assert_eq!(fake.specs().len(), 1);
        wait_until_clean(&fake).await;
    }
}

#[tokio::test]
async fn cancelled_token_stops_the_run_asking_the_helper_first() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let exec = Arc::new(executor(&fake));
    let cancel = CancellationToken::new();
    let task = {
        let exec = exec.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            exec.execute("r5", &valid(request("bash", "sleep 100")), 0, cancel)
                .await
        })
    };
    while fake.attached() == 0 {
        tokio::task::yield_now().await;
    }
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!((r.status, r.stage), (Status::Stopped, Some(Stage::Run)));
    let name = &fake.specs()[0].name;
    assert_eq!(fake.signals(name), [Signal::Term], "SIGTERM was enough");
    assert_eq!(
        r.usage.cpu_time_ms,
        Some(1),
        "a stopped run reports its usage"
    );
    wait_until_clean(&fake).await;
}

#[tokio::test(start_paused = true)]
async fn a_helper_that_ignores_the_stop_is_killed_after_the_grace() {
    let fake = Arc::new(FakeEngine::new());
    fake.set_default(Behaviour::HangHard);
    let exec = Arc::new(executor(&fake));
    let cancel = CancellationToken::new();
    let task = {
        let exec = exec.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            exec.execute("r6", &valid(request("bash", "sleep 100")), 0, cancel)
                .await
        })
    };
    while fake.attached() == 0 {
        tokio::task::yield_now().await;
    }
    let asked = tokio::time::Instant::now();
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Stopped);
    let name = &fake.specs()[0].name;
    assert_eq!(fake.signals(name), [Signal::Term, Signal::Kill]);
    assert_eq!(asked.elapsed(), codebox::executor::stage::STOP_GRACE);
    wait_until_clean(&fake).await;
}

#[tokio::test(start_paused = true)]
async fn a_helper_that_never_reports_is_killed_at_the_backstop() {
    let fake = Arc::new(FakeEngine::new());
    fake.set_default(Behaviour::HangHard);
    let started = tokio::time::Instant::now();
    // Ruby has no check: a check's budget (compile_limits.timeout_seconds) would come first.
    let req = RunRequest {
        limits: Some(LimitsInput {
            timeout_seconds: Some(2.0),
            ..Default::default()
        }),
        ..request("ruby", "sleep 100")
    };
    let r = run(&fake, req).await;
    assert_eq!(
        (r.status, r.signal.as_deref()),
        (Status::TimedOut, Some("SIGKILL"))
    );
    // The limit, the host's grace, then the kill.
    assert_eq!(started.elapsed(), Duration::from_secs(2 + 5));
    assert_eq!(fake.signals(&fake.specs()[0].name), [Signal::Kill]);
    assert_eq!(r.usage.cpu_time_ms, None, "nobody measured it");
    wait_until_clean(&fake).await;
}

#[tokio::test(start_paused = true)]
async fn a_daemon_that_stops_answering_cannot_hold_a_run_past_its_limit_and_the_graces() {
    let fake = Arc::new(FakeEngine::new());
    fake.set_default(Behaviour::HangHard);
    let started = tokio::time::Instant::now();
    let req = RunRequest {
        limits: Some(LimitsInput {
            timeout_seconds: Some(2.0),
            ..Default::default()
        }),
        ..request("bash", "sleep 100")
    };
    let exec = Arc::new(executor(&fake));
    let task = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(&new_run_id(), &valid(req), 0, CancellationToken::new())
                .await
        })
    };
    while fake.attached() == 0 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    fake.freeze();
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message.starts_with("Docker stopped answering"),
        "{}",
        r.message
    );
    // The limit, the backstop's grace, then the end grace: not one second more.
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2 + 5) + codebox::executor::stage::END_GRACE
    );
}

#[tokio::test]
async fn the_helpers_own_deadline_reports_timed_out_with_output_and_usage() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::TimedOut {
        stdout: "before\n".into(),
    });
    let r = run(&fake, request("python", "while True: pass")).await;
    assert_eq!(r.status, Status::TimedOut);
    assert_eq!(r.stdout, "before\n");
    assert_eq!(r.usage.peak_memory_kb, Some(1024));
    assert!(
        fake.signals(&fake.specs()[0].name).is_empty(),
        "no kill was needed"
    );
}

#[tokio::test]
async fn a_malformed_stream_is_a_sandbox_error_and_the_container_is_killed() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::Raw(
        b"raw text from something that is not codebox-init".to_vec(),
    ));
    let r = run(&fake, request("python", "print(1)")).await;
    assert_eq!(r.status, Status::SandboxError);
    assert!(r.message.contains("malformed"), "{}", r.message);
    assert_eq!(fake.signals(&fake.specs()[0].name), [Signal::Kill]);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn a_container_killed_whole_is_out_of_memory_when_the_engine_records_the_oom_after_the_exit()
{
    // Under gVisor an OOM kill takes codebox-init with the program, and Docker may record the
    // OOM event after the exit, so only its events say so.
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::KilledWhole { oom_event: true });
    let r = run(&fake, request("bash", "x")).await;
    assert_eq!(
        (r.status, r.exit_code, r.stage),
        (Status::OutOfMemory, Some(137), Some(Stage::Run)),
        "{}",
        r.message
    );

    // Without that record, the kill came from outside; an engine that cannot list its events
    // leaves it at that too.
    for events_fail in [false, true] {
        let fake = Arc::new(FakeEngine::new());
        fake.script(Behaviour::KilledWhole { oom_event: false });
        if events_fail {
            fake.fail_at(Step::Events);
        }
        let r = run(&fake, request("bash", "x")).await;
        assert_eq!(r.status, Status::SandboxError, "{r:?}");
        assert!(
            r.message.contains("something outside codebox ended it"),
            "{}",
            r.message
        );
        wait_until_clean(&fake).await;
    }
}

#[tokio::test]
async fn out_of_memory_needs_the_kill_and_the_cgroup_evidence() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(Behaviour::Signal {
        signal: 9,
        oom: true,
    });
    fake.script(Behaviour::Signal {
        signal: 9,
        oom: false,
    });
    let r = run(&fake, request("python", "x")).await;
    assert_eq!((r.status, r.exit_code), (Status::OutOfMemory, Some(137)));
    let r = run(&fake, request("python", "x")).await;
    assert_eq!(
        (r.status, r.signal.as_deref()),
        (Status::Failed, Some("SIGKILL"))
    );
}

#[tokio::test]
async fn containers_removed_when_the_run_task_is_aborted() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let exec = Arc::new(executor(&fake));
    let task = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(
                "r6",
                &valid(request("python", "x")),
                0,
                CancellationToken::new(),
            )
            .await
        })
    };
    while fake.attached() == 0 {
        tokio::task::yield_now().await;
    }
    assert!(!fake.live_containers().is_empty());
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn containers_removed_when_the_run_task_panics() {
    let fake = Arc::new(FakeEngine::new());
    fake.panic_on_start();
    let exec = Arc::new(executor(&fake));
    let task = {
        let exec = exec.clone();
        tokio::spawn(async move {
            exec.execute(
                "r8",
                &valid(request("bash", "true")),
                0,
                CancellationToken::new(),
            )
            .await
        })
    };
    assert!(task.await.unwrap_err().is_panic());
    assert_eq!(fake.specs().len(), 1, "the run container had been created");
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn failed_removals_are_retried_in_the_background() {
    let fake = Arc::new(FakeEngine::new());
    let exec = executor(&fake);
    fake.fail_removals(2);
    let r = exec
        .execute(
            "r9",
            &valid(request("cpp", "int main(){}")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    wait_until_clean(&fake).await;
    assert!(!exec.cleanup().failed());
}

#[tokio::test]
async fn a_removal_that_keeps_failing_is_recorded_for_the_instance_lock() {
    let fake = Arc::new(FakeEngine::new());
    let exec = executor(&fake);
    fake.fail_at(Step::Remove);
    let r = run(&fake, request("bash", "true")).await;
    assert_eq!(r.status, Status::Succeeded);
    let r = exec
        .execute(
            "r10",
            &valid(request("bash", "true")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::Succeeded);
    tokio::time::pause();
    assert!(exec.cleanup().drain(Duration::from_secs(60)).await);
    assert!(exec.cleanup().failed());
}

#[tokio::test]
async fn scripted_exit_codes_reach_the_report() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(exited(3, "out\n"));
    let r = run(&fake, request("bash", "exit 3")).await;
    assert_eq!((r.status, r.exit_code), (Status::Failed, Some(3)));
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stdout_bytes, 4);
    assert!(!r.stdout_truncated);
}

/// An execution on its own task, cancelled by the returned token.
fn spawn_run(
    fake: &Arc<FakeEngine>,
    req: RunRequest,
) -> (
    tokio::task::JoinHandle<codebox::report::RunReport>,
    CancellationToken,
) {
    let ex = Arc::new(executor(fake));
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let req = valid(req);
    let task = tokio::spawn(async move { ex.execute(&new_run_id(), &req, 0, token).await });
    (task, cancel)
}

#[tokio::test]
async fn no_stdin_writer_outlives_a_stage_that_ends_early() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    fake.fail_at(Step::Kill);
    let (task, cancel) = spawn_run(&fake, request("python", "print(1)"));
    eventually(10, "the program started", || fake.attached() == 1).await;
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::SandboxError, "{}", r.message);
    assert!(r.message.contains("signalling"), "{}", r.message);
    eventually(5, "the attach connection's write half was dropped", || {
        fake.open_inputs() == 0
    })
    .await;
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn a_stopped_run_with_tests_creates_no_container_for_cases_not_started() {
    let fake = Arc::new(FakeEngine::new());
    fake.hang_on_start();
    let tests: Vec<_> = (0..10)
        .map(|i| codebox::contract::TestInput {
            name: Some(format!("case {i}")),
            ..Default::default()
        })
        .collect();
    let (task, cancel) = spawn_run(
        &fake,
        RunRequest {
            tests: Some(tests),
            ..request("python", "print(1)")
        },
    );
    eventually(10, "the first case started", || fake.attached() == 1).await;
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{}", r.message);
    assert_eq!(r.tests.len(), 10);
    assert!(r.tests.iter().all(|t| t.status == Status::Stopped));
    assert_eq!(
        fake.specs().len(),
        1,
        "only the first case's container was ever created"
    );
    wait_until_clean(&fake).await;
}

/// An engine call that never answers must not hold a run: a stop ends it at once.
async fn a_stuck_step_yields_to_a_stop(step: Step, language: &str) {
    let fake = Arc::new(FakeEngine::new());
    fake.stick_at(step);
    let (task, cancel) = spawn_run(&fake, request(language, "print(1)"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    cancel.cancel();
    let r = tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .unwrap_or_else(|_| panic!("a stop did not end a run stuck at {step:?}"))
        .unwrap();
    assert_eq!(r.status, Status::Stopped, "{step:?}: {}", r.message);
}

#[tokio::test(start_paused = true)]
async fn a_stop_ends_a_run_whose_engine_call_never_answers() {
    a_stuck_step_yields_to_a_stop(Step::CreateContainer, "python").await;
    a_stuck_step_yields_to_a_stop(Step::Attach, "python").await;
    a_stuck_step_yields_to_a_stop(Step::Start, "python").await;
    a_stuck_step_yields_to_a_stop(Step::InspectImage, "cpp").await;
}

/// Without a stop, the run's own deadline ends it: a sandbox error that names Docker.
async fn a_stuck_step_yields_to_the_deadline(step: Step, language: &str) {
    let fake = Arc::new(FakeEngine::new());
    fake.stick_at(step);
    let (task, _cancel) = spawn_run(
        &fake,
        RunRequest {
            limits: limits(None, Some(5.0)),
            ..request(language, "print(1)")
        },
    );
    let r = tokio::time::timeout(Duration::from_secs(3600), task)
        .await
        .unwrap_or_else(|_| panic!("the deadline did not end a run stuck at {step:?}"))
        .unwrap();
    assert_eq!(r.status, Status::SandboxError, "{step:?}: {}", r.message);
    assert!(r.message.contains("Docker"), "{step:?}: {}", r.message);
}

#[tokio::test(start_paused = true)]
async fn the_run_deadline_ends_a_run_whose_engine_call_never_answers() {
    a_stuck_step_yields_to_the_deadline(Step::CreateContainer, "python").await;
    a_stuck_step_yields_to_the_deadline(Step::Attach, "python").await;
    a_stuck_step_yields_to_the_deadline(Step::Start, "python").await;
    a_stuck_step_yields_to_the_deadline(Step::InspectImage, "cpp").await;
}

/// Found at shutdown: a server stopped right after it admitted a run ended the run `stopped`
/// but left its container `Created`: the daemon finished the create nobody waited for, after
/// the removal had found nothing to remove.
#[tokio::test(start_paused = true)]
async fn a_container_whose_create_was_abandoned_is_removed_once_the_daemon_made_it() {
    let fake = Arc::new(FakeEngine::new());
    fake.delay(Step::CreateContainer, Duration::from_secs(5));
    let (task, cancel) = spawn_run(&fake, request("python", "print(1)"));
    eventually(10, "the create was asked for", || {
        fake.calls(Step::CreateContainer) == 1
    })
    .await;
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!(r.status, Status::Stopped, "{}", r.message);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(fake.specs().len(), 1, "the daemon made the container");
    wait_until_clean(&fake).await;
}
