//! The `serve` and `history` commands of the real binary: effective configuration (file, then
//! environment, then flags) and its validation, start-up refusals, and the history listing.

use std::process::{Command, Output};

use crate::common::codebox_bin;

fn codebox(args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(codebox_bin())
        .args(args)
        .env_remove("CODEBOX_TOKEN")
        .envs(envs.iter().copied())
        .output()
        .expect("run codebox")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn print_config_shows_file_then_env_then_flags_and_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("codebox.toml");
    std::fs::write(
        &file,
        "[runs]\nmax_concurrent_runs = 3\nmax_queued_runs = 50\nmemory_budget_mb = 4096\n",
    )
    .unwrap();
    let o = codebox(
        &[
            "--config",
            file.to_str().unwrap(),
            "serve",
            "--print-config",
            "--set",
            "runs.max_queued_runs=7",
            "--listen",
            "127.0.0.1:9999",
        ],
        &[
            ("CODEBOX_DATA_DIR", dir.path().to_str().unwrap()),
            ("CODEBOX_MAX_QUEUED_RUNS", "20"),
            ("CODEBOX_MEMORY_BUDGET_MB", "6000"),
            ("CODEBOX_TOKEN", "super-secret-token-value"),
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let parsed =
        codebox::config::from_toml(&out).expect("the printed config is a valid config file");
    assert_eq!(parsed.runs.max_concurrent_runs, 3, "from the file");
    assert_eq!(
        parsed.runs.memory_budget_mb, 6000,
        "the environment beats the file"
    );
    assert_eq!(
        parsed.runs.max_queued_runs, 7,
        "a flag beats the environment"
    );
    assert_eq!(parsed.http.listen, "127.0.0.1:9999");
    assert!(!out.contains("super-secret-token-value"));
}

#[test]
fn invalid_settings_stop_the_server_with_the_setting_and_value_named() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let o = codebox(
        &["serve", "--print-config"],
        &[
            ("CODEBOX_DATA_DIR", data),
            ("CODEBOX_MAX_CONCURRENT_RUNS", "0"),
        ],
    );
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(
        err.contains("runs.max_concurrent_runs") && err.contains('0'),
        "{err}"
    );
    let o = codebox(
        &[
            "serve",
            "--set",
            "history.code=everything",
            "--print-config",
        ],
        &[("CODEBOX_DATA_DIR", data)],
    );
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("history.code") && stderr(&o).contains("everything"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn http_without_a_token_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let o = codebox(
        &["serve", "--transport", "http", "--listen", "0.0.0.0:0"],
        &[("CODEBOX_DATA_DIR", data)],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("CODEBOX_TOKEN"), "{}", stderr(&o));
    let o = codebox(
        &[
            "serve",
            "--transport",
            "http",
            "--listen",
            "0.0.0.0:0",
            "--no-auth",
        ],
        &[("CODEBOX_DATA_DIR", data)],
    );
    assert!(!o.status.success());
    assert!(stderr(&o).contains("loopback"), "{}", stderr(&o));
}

#[test]
fn history_command_prints_rows_as_table_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let o = codebox(&["history"], &[("CODEBOX_DATA_DIR", data)]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("no runs recorded yet"),
        "{}",
        stdout(&o)
    );
    // Write two rows the way the server does.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let h = codebox::history::History::open(
            &dir.path().join("history.sqlite3"),
            codebox::history::Owner {
                instance: "cli-test".into(),
                data_dir: dir.path().to_path_buf(),
                ..Default::default()
            },
        );
        let limits = codebox::report::RunLimits {
            memory_mb: 512,
            timeout_seconds: 30.0,
            cpus: 1.0,
        };
        for (id, lang) in [("run-a", "python"), ("run-b", "cpp")] {
            h.insert(codebox::history::NewRun::new(
                id,
                lang,
                limits,
                "code",
                codebox::config::CodePolicy::Preview,
                "cli-test",
            ));
        }
        h.query(Default::default()).await.unwrap();
    });
    let o = codebox(
        &["history", "--json", "--language", "c++"],
        &[("CODEBOX_DATA_DIR", data)],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0]["run_id"], "run-b");
    let o = codebox(&["history", "--limit", "1"], &[("CODEBOX_DATA_DIR", data)]);
    let table = stdout(&o);
    assert!(
        table.starts_with("RUN ID") && table.contains("run-b") && !table.contains("run-a"),
        "{table}"
    );
    let o = codebox(
        &["history", "--status", "exploded"],
        &[("CODEBOX_DATA_DIR", data)],
    );
    assert!(
        !o.status.success() && stderr(&o).contains("status"),
        "{}",
        stderr(&o)
    );
}
