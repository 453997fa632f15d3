//! Control-flow corner cases against the fake engine: what was asked of the engine, and that
//! every path removes what it created. Plus request rejections, which never reach an engine.

use std::sync::Arc;
use std::time::Duration;

use codebox::config::Config;
use codebox::engine::fake::{FakeEngine, Step};
use codebox::engine::ContainerEngine;
use codebox::executor::{Executor, FileInput, LimitsInput, RunRequest, ValidRequest};
use codebox::report::{Stage, Status};
use tokio_util::sync::CancellationToken;

use crate::common::{registry, request};

fn executor(fake: &Arc<FakeEngine>) -> Executor {
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    Executor::new(engine, Arc::new(Config::default()), "fake-instance".into())
}

fn valid(req: RunRequest) -> ValidRequest {
    ValidRequest::new(req, &registry(), &Config::default()).expect("valid")
}

fn reject(req: RunRequest) -> String {
    let e = ValidRequest::new(req, &registry(), &Config::default()).unwrap_err();
    e.to_string()
}

async fn wait_until_clean(fake: &FakeEngine) {
    for _ in 0..250 {
        if fake.live_containers().is_empty() && fake.live_volumes().is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "left behind: containers {:?}, volumes {:?}",
        fake.live_containers(),
        fake.live_volumes()
    );
}

#[tokio::test]
async fn every_container_spec_is_locked_down() {
    let fake = Arc::new(FakeEngine::new());
    let r = executor(&fake)
        .execute(
            "r1",
            &valid(request("python", "print(1)")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    let specs = fake.specs();
    assert_eq!(specs.len(), 2, "a compile and a run container");
    for s in &specs {
        assert_eq!(s.network_mode, "none");
        assert!(s.readonly_rootfs);
        assert_eq!(s.user, specs[0].user, "both stages of a run use its uid");
        let uid: u32 = s.user.split(':').next().unwrap().parse().unwrap();
        assert!((10001..=10064).contains(&uid), "{}", s.user);
        assert_eq!(s.cap_drop, ["ALL"]);
        assert!(s.cap_add.is_empty() && s.devices.is_empty() && !s.privileged);
        assert!(s.security_opt.contains(&"no-new-privileges".to_string()));
        assert_eq!(s.pids_limit, 256);
        assert_eq!(s.memory_bytes, s.memory_swap_bytes);
        assert!(s.tmpfs["/tmp"].contains("noexec"));
        assert_eq!(s.labels["codebox.managed"], "true");
        assert_eq!(s.labels["codebox.run"], "r1");
        assert_eq!(s.labels["codebox.instance"], "fake-instance");
        assert!(!s.env.contains_key("DOCKER_HOST"));
        assert_eq!(s.env.len(), 6, "minimal environment: {:?}", s.env);
    }
    let (compile, run) = (&specs[0], &specs[1]);
    assert!(
        !compile.mounts[0].read_only,
        "compile stage writes the workspace"
    );
    assert!(
        run.mounts[0].read_only,
        "run stage must not write the workspace"
    );
    assert_eq!(run.memory_bytes, 512 * 1024 * 1024);
    assert_eq!(run.nano_cpus, 1_000_000_000);
    assert_eq!(run.cmd, ["python3", "main.py"]);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn interpreted_languages_load_the_workspace_without_starting_a_loader() {
    let fake = Arc::new(FakeEngine::new());
    let r = executor(&fake)
        .execute(
            "r2",
            &valid(request("bash", "echo hi")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::Succeeded);
    assert_eq!(fake.started(), 1, "only the run container is started");
    assert!(r.compile.is_none());
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn container_removed_when_upload_fails() {
    let fake = Arc::new(FakeEngine::new());
    fake.fail_at(Step::Upload);
    let r = executor(&fake)
        .execute(
            "r3",
            &valid(request("python", "print(1)")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message
            .contains("copying the code into the container failed"),
        "{}",
        r.message
    );
    assert_eq!(fake.specs().len(), 1);
    assert!(fake.live_containers().is_empty() && fake.live_volumes().is_empty());
}

#[tokio::test]
async fn container_removed_when_create_fails() {
    let fake = Arc::new(FakeEngine::new());
    fake.fail_at(Step::CreateContainer);
    let r = executor(&fake)
        .execute(
            "r4",
            &valid(request("python", "print(1)")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::SandboxError);
    assert!(
        r.message.contains("creating the container failed"),
        "{}",
        r.message
    );
    assert!(fake.live_volumes().is_empty());
}

#[tokio::test]
async fn cancelled_token_stops_the_run_and_removes_containers() {
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
    while fake.started() == 0 {
        tokio::task::yield_now().await;
    }
    cancel.cancel();
    let r = task.await.unwrap();
    assert_eq!((r.status, r.stage), (Status::Stopped, Some(Stage::Run)));
    assert!(fake.live_containers().is_empty() && fake.live_volumes().is_empty());
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
    while fake.started() == 0 {
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
    assert_eq!(
        fake.specs().len(),
        2,
        "the loader and the run container had been created"
    );
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn failed_removals_are_retried_in_the_background() {
    let fake = Arc::new(FakeEngine::new());
    let exec = executor(&fake);
    // The compile container's removal fails twice (during the run, then at release): the
    // run is unaffected and the container is removed by the background retry.
    fake.fail_removals(2);
    let r = exec
        .execute(
            "r9",
            &valid(request("python", "print(1)")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(r.status, Status::Succeeded, "{}", r.message);
    wait_until_clean(&fake).await;
}

#[tokio::test]
async fn compile_failure_skips_the_run_stage() {
    let fake = Arc::new(FakeEngine::new());
    fake.script(codebox::engine::fake::exited(1, ""));
    let r = executor(&fake)
        .execute(
            "r7",
            &valid(request("cpp", "int main(")),
            0,
            CancellationToken::new(),
        )
        .await;
    assert_eq!(
        (r.status, r.stage, r.exit_code),
        (Status::CompileError, Some(Stage::Compile), Some(1))
    );
    assert_eq!(
        fake.specs().len(),
        1,
        "no run container after a compile error"
    );
    wait_until_clean(&fake).await;
}

// ---- rejections -----------------------------------------------------------------------------

fn with_limits(
    memory_mb: Option<f64>,
    timeout_seconds: Option<f64>,
    cpus: Option<f64>,
) -> RunRequest {
    RunRequest {
        limits: Some(LimitsInput {
            memory_mb,
            timeout_seconds,
            cpus,
        }),
        ..request("python", "print(1)")
    }
}

#[test]
fn unknown_language_is_rejected_naming_the_choices() {
    let msg = reject(request("cobol", "x"));
    assert!(
        msg.starts_with("language: unknown language `cobol`"),
        "{msg}"
    );
    assert!(msg.contains("python"), "{msg}");
}

#[test]
fn aliases_resolve_to_their_language() {
    assert_eq!(valid(request("py", "print(1)")).language.id, "python");
    assert_eq!(valid(request("C++", "int main(){}")).language.id, "cpp");
}

#[test]
fn empty_code_is_rejected() {
    assert_eq!(reject(request("python", "  \n")), "code: must not be empty");
}

#[test]
fn oversized_code_is_rejected() {
    let big = "#".repeat(Config::default().sandbox.max_code_bytes + 1);
    let msg = reject(request("python", &big));
    assert!(
        msg.starts_with("code: is 524289 bytes; the maximum is 524288 bytes"),
        "{msg}"
    );
}

#[test]
fn path_traversal_in_files_is_rejected() {
    for (path, why) in [
        ("../etc/passwd", "contains `..`"),
        ("a/../../x", "contains `..`"),
        ("/etc/passwd", "is absolute"),
        ("main.py", "clashes with the source file"),
        ("./main.py", "clashes with the source file"),
        ("", "relative path of 1 to 255 bytes"),
    ] {
        let req = RunRequest {
            files: Some(vec![FileInput {
                path: path.into(),
                content: "x".into(),
                encoding: None,
            }]),
            ..request("python", "print(1)")
        };
        let msg = reject(req);
        assert!(msg.starts_with("files[0].path:"), "{path}: {msg}");
        assert!(msg.contains(why), "{path}: {msg}");
    }
}

#[test]
fn limits_over_a_ceiling_are_rejected_not_clamped() {
    assert_eq!(
        reject(with_limits(Some(32768.0), None, None)),
        "limits.memory_mb: requested 32768 MB of memory; the maximum is 16384 MB"
    );
    assert_eq!(
        reject(with_limits(None, Some(7200.0), None)),
        "limits.timeout_seconds: requested 7200 s of wall-clock time; the maximum is 3600 s"
    );
    assert_eq!(
        reject(with_limits(None, None, Some(8.0))),
        "limits.cpus: requested 8 cpus of CPU; the maximum is 4 cpus"
    );
}

#[test]
fn non_positive_and_non_finite_limits_are_rejected() {
    for (req, field) in [
        (with_limits(Some(0.0), None, None), "limits.memory_mb"),
        (with_limits(Some(-5.0), None, None), "limits.memory_mb"),
        (with_limits(None, Some(0.0), None), "limits.timeout_seconds"),
        (
            with_limits(None, Some(f64::NAN), None),
            "limits.timeout_seconds",
        ),
        (
            with_limits(None, Some(f64::INFINITY), None),
            "limits.timeout_seconds",
        ),
        (with_limits(None, None, Some(-1.0)), "limits.cpus"),
        (with_limits(Some(100.5), None, None), "limits.memory_mb"),
    ] {
        let msg = reject(req);
        assert!(msg.starts_with(&format!("{field}:")), "{msg}");
    }
}

#[test]
fn limits_within_ceilings_are_kept_exactly() {
    let v = valid(with_limits(Some(16384.0), Some(0.5), Some(4.0)));
    assert_eq!(
        (v.limits.memory_mb, v.limits.timeout_seconds, v.limits.cpus),
        (16384, 0.5, 4.0)
    );
    let d = valid(request("python", "print(1)"));
    assert_eq!(
        (d.limits.memory_mb, d.limits.timeout_seconds, d.limits.cpus),
        (512, 30.0, 1.0)
    );
}

#[test]
fn bad_base64_file_content_is_rejected() {
    let req = RunRequest {
        files: Some(vec![FileInput {
            path: "x.bin".into(),
            content: "not base64!".into(),
            encoding: Some(codebox::executor::Encoding::Base64),
        }]),
        ..request("python", "print(1)")
    };
    assert!(reject(req).starts_with("files[0].content: is not valid base64"));
}

#[test]
fn too_many_files_are_rejected() {
    let files = (0..33)
        .map(|i| FileInput {
            path: format!("f{i}.txt"),
            content: String::new(),
            encoding: None,
        })
        .collect();
    let req = RunRequest {
        files: Some(files),
        ..request("python", "print(1)")
    };
    assert_eq!(reject(req), "files: has 33 files; the maximum is 32");
}

#[test]
fn unknown_request_fields_are_rejected() {
    let err =
        serde_json::from_str::<RunRequest>(r#"{"language":"python","code":"1","network":true}"#)
            .unwrap_err();
    assert!(err.to_string().contains("unknown field `network`"), "{err}");
}
