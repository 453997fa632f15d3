//! Shared fixtures: the shipped registry, a Docker-backed executor, label checks.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use codebox::config::Config;
use codebox::contract::{LimitsInput, RunRequest, ValidRequest};
use codebox::engine::docker::DockerEngine;
use codebox::executor::{new_run_id, Executor};
use codebox::registry::Registry;
use codebox::report::RunReport;
use tokio_util::sync::CancellationToken;

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn registry() -> Arc<Registry> {
    static R: OnceLock<Arc<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Arc::new(Registry::load(&root().join("languages.toml")).expect("shipped registry loads"))
    })
    .clone()
}

/// An instance id shared by every test of this process.
pub fn instance() -> &'static str {
    static I: OnceLock<String> = OnceLock::new();
    I.get_or_init(|| format!("test{}", uuid::Uuid::new_v4().simple()))
}

/// The Docker daemon of the environment (`DOCKER_HOST` and friends, as the docker CLI reads
/// them), as every command would connect to it.
pub fn docker_engine() -> Result<DockerEngine, codebox::engine::EngineError> {
    DockerEngine::connect(
        &codebox::config::DockerSettings::default().or_docker_env(|k| std::env::var(k).ok()),
    )
}

pub fn docker_executor() -> Executor {
    docker_executor_with(Config::default())
}

/// The OCI runtime the real-Docker tests run under: `runc`, or what `CODEBOX_TEST_RUNTIME`
/// names (`scripts/test` runs the posture and outcome tests a second time under `runsc`).
pub fn test_runtime() -> String {
    std::env::var("CODEBOX_TEST_RUNTIME")
        .ok()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| "runc".to_string())
}

/// Whether the tests run under gVisor, where a few behaviours differ (each test says which and
/// why; README's "Under gVisor" lists them).
pub fn gvisor() -> bool {
    test_runtime() == "runsc"
}

pub fn docker_executor_with(mut config: Config) -> Executor {
    config.sandbox.runtime = test_runtime();
    let engine = docker_engine().expect("docker client");
    Executor::new(Arc::new(engine), Arc::new(config), instance().to_string())
}

pub fn request(language: &str, code: &str) -> RunRequest {
    RunRequest {
        language: language.into(),
        code: code.into(),
        ..Default::default()
    }
}

pub fn py(code: &str) -> RunRequest {
    request("python", code)
}

pub fn cpp(code: &str) -> RunRequest {
    request("cpp", code)
}

/// `req` validated against the shipped registry and the default configuration.
pub fn valid(req: RunRequest) -> ValidRequest {
    ValidRequest::new(req, &registry(), &Config::default()).expect("valid")
}

/// Limits with the given memory and timeout, the default CPU.
pub fn limits(memory_mb: Option<f64>, timeout_seconds: Option<f64>) -> Option<LimitsInput> {
    Some(LimitsInput {
        memory_mb,
        timeout_seconds,
        cpus: None,
    })
}

/// Run a Python program that creates processes or threads until the pids limit stops it and
/// prints `<word> N`; return N.
pub async fn count_until_the_pids_limit(code: &str, word: &str) -> i64 {
    let r = run(py(code)).await;
    assert_eq!(r.status, codebox::report::Status::Succeeded, "{r:?}");
    r.stdout
        .trim()
        .strip_prefix(&format!("{word} "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("unexpected output {:?}", r.stdout))
}

/// Run a request on real Docker, then check nothing labelled with its run id is left.
pub async fn run(req: RunRequest) -> RunReport {
    run_with(&docker_executor(), req).await
}

pub async fn run_with(exec: &Executor, req: RunRequest) -> RunReport {
    let valid = ValidRequest::new(req, &registry(), exec.config()).expect("valid request");
    let id = new_run_id();
    let report = exec.execute(&id, &valid, 0, CancellationToken::new()).await;
    assert_no_leftovers(&id).await;
    report
}

/// Objects (containers and volumes) labelled with this run id that still exist.
pub fn leftovers(run_id: &str) -> Vec<String> {
    labelled_objects(&format!("label=codebox.run={run_id}"))
}

/// Containers and volumes matching a `docker` label filter (`label=KEY=VALUE`).
pub fn labelled_objects(filter: &str) -> Vec<String> {
    let mut found = Vec::new();
    for args in [
        vec!["ps", "-aq", "--filter", filter],
        vec!["volume", "ls", "-q", "--filter", filter],
    ] {
        let out = Command::new("docker")
            .args(&args)
            .output()
            .expect("docker CLI");
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        found.extend(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string),
        );
    }
    found
}

/// Containers are removed in the background once a run's report is made: wait for them to
/// go (up to 20 s), then fail if any is left.
pub async fn assert_no_leftovers(run_id: &str) {
    let mut left = leftovers(run_id);
    for _ in 0..200 {
        if left.is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        left = leftovers(run_id);
    }
    panic!("run {run_id} left containers or volumes behind: {left:?}");
}

pub fn codebox_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_codebox"))
}

/// A data directory shared by every binary this test process starts (history, instance
/// locks), so tests never touch the user's own.
pub fn data_dir() -> &'static Path {
    static D: OnceLock<tempfile::TempDir> = OnceLock::new();
    D.get_or_init(|| tempfile::tempdir().expect("temp dir"))
        .path()
}

/// The real binary with the shipped registry, the test data directory and no inherited
/// config file or token.
pub fn codebox_command() -> Command {
    let mut c = Command::new(codebox_bin());
    c.env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .env("CODEBOX_DATA_DIR", data_dir())
        .env("CODEBOX_SANDBOX_RUNTIME", test_runtime())
        .env_remove("CODEBOX_CONFIG")
        .env_remove("CODEBOX_TOKEN");
    c
}

/// A port nobody listens on now (the OS's pick).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}
