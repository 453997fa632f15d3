//! The commands on the fake engine: the same `App` as the binary builds, with the engine
//! swapped, so their logic is tested without Docker.

use std::sync::Arc;

use codebox::app::App;
use codebox::catalog::Catalog;
use codebox::cli::{self, Command};
use codebox::config::Config;
use codebox::engine::fake::{exited, FakeEngine};
use codebox::engine::ContainerEngine;
use codebox::history::Query;
use codebox::registry::Registry;

use crate::common::root;

fn app(fake: &Arc<FakeEngine>, data: &tempfile::TempDir) -> App {
    let config = Config {
        data_dir: data.path().to_path_buf(),
        ..Config::default()
    };
    let registry = Registry::load(&root().join("languages.toml")).unwrap();
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    App::build(config, registry, engine).unwrap()
}

fn text(out: Vec<u8>) -> String {
    String::from_utf8(out).unwrap()
}

#[tokio::test]
async fn languages_json_is_the_list_supported_languages_object() {
    let data = tempfile::tempdir().unwrap();
    let app = app(&Arc::new(FakeEngine::new()), &data);
    let mut out = Vec::new();
    assert_eq!(cli::languages(&app, true, &mut out).await.unwrap(), 0);
    let cat: Catalog = serde_json::from_slice(&out).unwrap();
    assert_eq!(cat.languages.len(), app.registry.languages.len());
    assert!(cat.languages.iter().all(|l| l.image_present));
    assert_eq!(cat.limits.defaults.memory_mb, 512);
}

#[tokio::test]
async fn codebox_run_records_its_run_in_the_history() {
    let data = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    let app = app(&fake, &data);
    let file = data.path().join("hello.py");
    std::fs::write(&file, "print('hi')\n").unwrap();
    let command = <cli::Cli as clap::Parser>::parse_from([
        "codebox",
        "run",
        file.to_str().unwrap(),
        "--",
        "a1",
    ])
    .command;
    let Command::Run(args) = command else {
        unreachable!()
    };
    assert_eq!(cli::run_file(&app, args).await.unwrap(), 0);
    let rows = app.history.query(Query::default()).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].language, "python");
    assert_eq!(rows[0].status.as_str(), "succeeded");
    let payload = fake.payloads().last().unwrap().clone();
    // Python's checked run: the check and the program in one interpreter, the args after.
    let run = payload.run.unwrap();
    assert_eq!(
        [&run[..2], &run[3..]],
        [["python3", "-c"], ["main.py", "a1"]]
    );
}

#[tokio::test]
async fn smoke_counts_passes_and_failures_and_fails_on_any_mismatch() {
    let data = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    let app = app(&fake, &data);
    // Every run on the fake exits 0 with no output: the `exit` samples of bash fail
    // (they expect exit 3), `hello` fails (no output), nothing passes but a sample that
    // expects plain success without output.
    let mut out = Vec::new();
    let code = cli::smoke(&app, &["bash".to_string()], false, &mut out)
        .await
        .unwrap();
    let out = text(out);
    assert_eq!(code, 1, "{out}");
    let last = out.lines().last().unwrap();
    assert_eq!(last, "0 passed, 6 failed", "{out}");
    assert!(
        out.contains("FAIL bash/hello: expected stdout \"hello\\n\", got \"\""),
        "{out}"
    );
}

#[tokio::test]
async fn doctor_passes_a_locked_down_probe_and_fails_a_root_one() {
    for (probe, code, failed) in [
        (
            "uid=10001\ncapeff=0000000000000000\nnnp=1\nnet=lo\nkernel=host\nrootfs=readonly\n",
            0,
            "0 failed",
        ),
        (
            "uid=0\ncapeff=0000000000000000\nnnp=1\nnet=lo\nkernel=host\nrootfs=readonly\n",
            1,
            "1 failed",
        ),
    ] {
        let data = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeEngine::new());
        fake.script(exited(0, probe));
        let app = app(&fake, &data);
        let mut out = Vec::new();
        assert_eq!(cli::doctor(&app, &mut out).await.unwrap(), code);
        let out = text(out);
        assert!(out.trim_end().ends_with(failed), "{out}");
        assert!(out.contains("reachable at fake://"), "{out}");
    }
}

#[tokio::test]
async fn doctor_names_the_fix_when_the_configured_runtime_is_missing() {
    let data = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    fake.script(exited(
        0,
        "uid=10001\ncapeff=0000000000000000\nnnp=1\nnet=lo\nkernel=host\nrootfs=readonly\n",
    ));
    let config = Config {
        data_dir: data.path().to_path_buf(),
        sandbox: codebox::config::SandboxSettings {
            runtime: "runsc".into(),
            ..Default::default()
        },
        ..Config::default()
    };
    let registry = Registry::load(&root().join("languages.toml")).unwrap();
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    let app = App::build(config, registry, engine).unwrap();
    let mut out = Vec::new();
    assert_eq!(cli::doctor(&app, &mut out).await.unwrap(), 1);
    let out = text(out);
    assert!(
        out.contains("FAIL runtime `runsc` (sandbox.runtime) is not registered")
            && out.contains("--with-runsc"),
        "{out}"
    );
}

/// A registry of a base image and three images built on it, in a temporary folder.
fn three_images_on_a_base(dir: &std::path::Path) -> Registry {
    let mut toml =
        String::from("[images.base]\ntag = \"test/base:1\"\ncontext = \"images/base\"\n");
    std::fs::create_dir_all(dir.join("images/base")).unwrap();
    std::fs::write(
        dir.join("images/base/Dockerfile"),
        "FROM debian:bookworm-slim\n",
    )
    .unwrap();
    for name in ["one", "two", "three"] {
        let folder = dir.join("images").join(name);
        std::fs::create_dir_all(&folder).unwrap();
        std::fs::write(
            folder.join("Dockerfile"),
            "FROM test/base:1\nUSER 10001:10001\n",
        )
        .unwrap();
        toml.push_str(&format!(
            "[images.{name}]\ntag = \"test/{name}:1\"\ncontext = \"images/{name}\"\n"
        ));
    }
    for name in ["one", "two", "three"] {
        toml.push_str(&format!(
            "[languages.{name}]\ndisplay_name = \"{name}\"\nimage = \"{name}\"\nsource_file = \"main.{name}\"\nrun = [\"true\"]\n"
        ));
    }
    std::fs::write(dir.join("languages.toml"), toml).unwrap();
    Registry::load(&dir.join("languages.toml")).unwrap()
}

#[tokio::test]
async fn images_build_in_parallel_each_after_the_image_it_builds_on() {
    let data = tempfile::tempdir().unwrap();
    let fake = Arc::new(FakeEngine::new());
    let registry = three_images_on_a_base(data.path());
    let engine: Arc<dyn ContainerEngine> = fake.clone();
    let config = Config {
        data_dir: data.path().join("data"),
        ..Config::default()
    };
    let app = App::build(config, registry, engine).unwrap();
    let command =
        <cli::Cli as clap::Parser>::parse_from(["codebox", "images", "build", "--jobs", "2"])
            .command;
    assert_eq!(cli::dispatch(&app, command).await.unwrap(), 0);
    let events = fake.builds();
    assert_eq!(events.len(), 8, "{events:?}");
    // The base first, alone; then the three, never more than two at once, and two at once
    // at some point.
    assert_eq!(
        events[..2],
        ["start test/base:1", "end test/base:1"],
        "{events:?}"
    );
    let (mut running, mut most) = (0, 0);
    for e in &events[2..] {
        running += if e.starts_with("start") { 1 } else { -1 };
        most = most.max(running);
    }
    assert_eq!(most, 2, "{events:?}");
    for name in ["one", "two", "three"] {
        assert!(events.contains(&format!("end test/{name}:1")), "{events:?}");
    }
}
