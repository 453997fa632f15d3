use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn shipped_defaults_match_the_contract() {
    let c = Config::default();
    assert_eq!(c.limits.default_memory_mb, 512);
    assert_eq!(c.limits.max_memory_mb, 16384);
    assert_eq!(c.limits.default_timeout_seconds, 30.0);
    assert_eq!(c.limits.max_timeout_seconds, 3600.0);
    assert_eq!(c.limits.default_cpus, 1.0);
    assert_eq!(c.limits.max_cpus, 4.0);
    assert_eq!(c.sandbox.pids_limit, 256);
    assert_eq!(c.sandbox.output_limit_bytes, 1 << 20);
    assert_eq!(c.runs.max_concurrent_runs, 4);
    assert_eq!(c.runs.result_retention_seconds, 3600);
    assert_eq!(c.runs.retained_reports_mb, 256);
    assert_eq!(c.history.code, CodePolicy::Preview);
    validate(&c).unwrap();
}

#[test]
fn config_file_errors_name_the_setting_and_value() {
    let err = from_toml("[limits]\ndefault_memory_mb = 99999\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("limits.default_memory_mb"), "{msg}");
    assert!(msg.contains("99999"), "{msg}");
    let err = from_toml("[limits]\nbogus = 1\n").unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn every_setting_has_a_file_key_a_flag_and_a_variable() {
    let settings = Config::settings();
    for path in [
        "data_dir",
        "languages",
        "limits.default_cpus",
        "limits.max_cpus",
        "sandbox.pids_limit",
        "sandbox.max_args",
        "sandbox.max_arg_bytes",
        "runs.max_concurrent_runs",
        "history.path",
        "history.code",
        "http.allowed_hosts",
        "http.token_file",
    ] {
        let s = settings
            .iter()
            .find(|s| s.path == path)
            .unwrap_or_else(|| panic!("{path} is not a setting"));
        assert!(!s.doc.is_empty(), "{path} has no documentation");
        assert_eq!(s.env, env_name(path));
    }
    for s in &settings {
        for var in std::iter::once(&s.env).chain(&s.env_short) {
            assert!(!RESERVED_ENV.contains(&var.as_str()), "{var}");
        }
    }
    // The variables documented before settings were derived keep working.
    for (var, path) in [
        ("CODEBOX_DATA_DIR", "data_dir"),
        ("CODEBOX_DEFAULT_MEMORY_MB", "limits.default_memory_mb"),
        ("CODEBOX_MAX_CONCURRENT_RUNS", "runs.max_concurrent_runs"),
        ("CODEBOX_RETAINED_REPORTS_MB", "runs.retained_reports_mb"),
        ("CODEBOX_HISTORY_PATH", "history.path"),
        ("CODEBOX_HISTORY_CODE", "history.code"),
        ("CODEBOX_LISTEN", "http.listen"),
        ("CODEBOX_ALLOWED_HOSTS", "http.allowed_hosts"),
        ("CODEBOX_MAX_BODY_BYTES", "http.max_body_bytes"),
        ("CODEBOX_MEMORY_BUDGET_MB", "runs.memory_budget_mb"),
    ] {
        let s = settings.iter().find(|s| s.path == path).unwrap();
        assert!(
            s.env == var || s.env_short.as_deref() == Some(var),
            "{var} does not set {path}: {s:?}"
        );
    }
}

#[test]
fn file_then_variables_then_flags() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[runs]\nmax_concurrent_runs = 3\nmax_queued_runs = 7\n[sandbox]\npids_limit = 100\n",
    )
    .unwrap();
    let env = |k: &str| match k {
        "CODEBOX_MAX_CONCURRENT_RUNS" => Some("2".to_string()),
        "CODEBOX_SANDBOX_PIDS_LIMIT" => Some("90".to_string()),
        "CODEBOX_PIDS_LIMIT" => Some("80".to_string()),
        "CODEBOX_ALLOWED_HOSTS" => Some("a.example, b.example".to_string()),
        "CODEBOX_HISTORY_CODE" => Some("full".to_string()),
        _ => None,
    };
    let c = resolve(
        Some(&file),
        env,
        &["sandbox.pids_limit=64".into(), "limits.max_cpus=2".into()],
    )
    .unwrap();
    assert_eq!(c.runs.max_concurrent_runs, 2, "a variable beats the file");
    assert_eq!(c.runs.max_queued_runs, 7, "the file beats the default");
    assert_eq!(c.sandbox.pids_limit, 64, "a flag beats everything");
    assert_eq!(c.limits.max_cpus, 2.0);
    assert_eq!(c.http.allowed_hosts, ["a.example", "b.example"]);
    assert_eq!(c.history.code, CodePolicy::Full);
    let c = resolve(Some(&file), env, &[]).unwrap();
    assert_eq!(
        c.sandbox.pids_limit, 90,
        "the section-qualified variable wins over the short one"
    );
}

#[test]
fn docker_settings_beat_the_docker_cli_variables_which_beat_the_default() {
    let cli_env = |k: &str| match k {
        "DOCKER_HOST" => Some("tcp://10.0.0.5:2376".to_string()),
        "DOCKER_TLS_VERIFY" => Some("1".to_string()),
        "DOCKER_CERT_PATH" => Some("/certs".to_string()),
        _ => None,
    };
    let c = resolve(None, no_env, &[]).unwrap();
    assert_eq!(c.docker.address(), DEFAULT_DOCKER_HOST);
    assert!(!c.docker.uses_tls());

    let c = resolve(None, cli_env, &[]).unwrap();
    assert_eq!(c.docker.address(), "tcp://10.0.0.5:2376");
    assert!(c.docker.uses_tls());
    assert_eq!(c.docker.cert_dir(), PathBuf::from("/certs"));
    assert_eq!(
        c.docker.cli_env(),
        [
            ("DOCKER_HOST", "tcp://10.0.0.5:2376".to_string()),
            ("DOCKER_TLS_VERIFY", "1".to_string()),
            ("DOCKER_CERT_PATH", "/certs".to_string())
        ]
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[docker]\nhost = \"tcp://docker.example:2376\"\ncert_path = \"/etc/codebox/docker\"\n",
    )
    .unwrap();
    let c = resolve(Some(&file), cli_env, &[]).unwrap();
    assert_eq!(c.docker.address(), "tcp://docker.example:2376");
    assert_eq!(c.docker.cert_dir(), PathBuf::from("/etc/codebox/docker"));
    assert!(
        c.docker.uses_tls(),
        "DOCKER_TLS_VERIFY fills what the file leaves unset"
    );
    let c = resolve(
        Some(&file),
        cli_env,
        &["docker.host=unix:///run/other.sock".into()],
    )
    .unwrap();
    assert_eq!(c.docker.address(), "unix:///run/other.sock");
    assert!(!c.docker.uses_tls(), "TLS is for tcp:// only");
    assert_eq!(from_toml(&c.to_toml()).unwrap(), c);

    let settings = Config::settings();
    let host = settings.iter().find(|s| s.path == "docker.host").unwrap();
    assert_eq!(host.env, "CODEBOX_DOCKER_HOST");
    assert_eq!(host.env_fallback.as_deref(), Some("DOCKER_HOST"));

    for bad in [
        "ssh://me@host",
        "tcp://host",
        "host:2376",
        "unix://relative.sock",
    ] {
        let msg = resolve(None, no_env, &[format!("docker.host={bad}")])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("docker.host") && msg.contains(bad), "{msg}");
    }
}

#[test]
fn bad_values_name_the_setting_the_value_and_where_it_came_from() {
    let env = |k: &str| (k == "CODEBOX_MAX_CONCURRENT_RUNS").then(|| "lots".to_string());
    let msg = resolve(None, env, &[]).unwrap_err().to_string();
    assert!(
        msg.contains("runs.max_concurrent_runs")
            && msg.contains("lots")
            && msg.contains("CODEBOX_MAX_CONCURRENT_RUNS"),
        "{msg}"
    );
    let msg = resolve(None, no_env, &["runs.nope=1".into()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("runs.nope") && msg.contains("--set"), "{msg}");
    let msg = resolve(None, no_env, &["runs.max_queued_runs".into()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("SETTING=VALUE"), "{msg}");
    let msg = resolve(None, no_env, &["history.code=most".into()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("most"), "{msg}");
    let msg = resolve(None, no_env, &["runs.result_retention_seconds=5".into()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("runs.result_retention_seconds"), "{msg}");
}

#[test]
fn a_postgres_history_url_is_checked_and_never_holds_a_password() {
    let c = resolve(
        None,
        no_env,
        &["history.url=postgres://codebox@db.internal:5433/codebox".into()],
    )
    .unwrap();
    assert!(
        matches!(c.history_store(), HistoryStore::Postgres { ref url, .. } if url.ends_with("/codebox"))
    );
    assert_eq!(
        Config::default().history_store(),
        HistoryStore::Sqlite(Config::default().data_dir.join(DEFAULT_HISTORY_FILE)),
        "SQLite stays the default"
    );
    let socket = "postgres://codebox@%2Frun%2Fpostgresql/codebox";
    let env = |k: &str| (k == "CODEBOX_HISTORY_URL").then(|| socket.to_string());
    assert_eq!(
        resolve(None, env, &[]).unwrap().history.url.as_deref(),
        Some(socket)
    );
    for (url, words) in [
        ("mysql://x@y/z", "postgres://"),
        ("postgres://codebox:hunter2@db/codebox", "password_file"),
        (
            "postgres://codebox@db/codebox?sslmode=verify-full&sslrootcert=%2Fno%2Fca.pem",
            "/no/ca.pem does not exist",
        ),
        ("postgres://codebox@db/codebox?sslmode=allow", "verify-ca"),
        ("postgres://codebox@db/codebox?bogus=1", "understands"),
    ] {
        let msg = resolve(None, no_env, &[format!("history.url={url}")])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("history.url") && msg.contains(words),
            "{url}: {msg}"
        );
        assert!(
            !msg.contains("hunter2"),
            "the password is never repeated: {msg}"
        );
    }
    let msg = resolve(
        None,
        no_env,
        &[
            "history.url=postgres://codebox@db/codebox".into(),
            "history.path=/x/h.sqlite3".into(),
        ],
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("history.path") && msg.contains("one of them"),
        "{msg}"
    );
    let msg = resolve(None, no_env, &["history.password_file=/pw".into()])
        .unwrap_err()
        .to_string();
    assert!(msg.contains("history.password_file"), "{msg}");
}

#[test]
fn printed_config_reads_back_as_the_same_config() {
    let c = resolve(
        None,
        no_env,
        &[
            "runs.max_concurrent_runs=3".into(),
            "history.code=none".into(),
            "history.path=/somewhere/h.sqlite3".into(),
            "http.listen=0.0.0.0:9000".into(),
            "http.allowed_hosts=x.example".into(),
            "sandbox.max_args=9".into(),
            "limits.default_cpus=0.5".into(),
        ],
    )
    .unwrap();
    let again = from_toml(&c.to_toml()).unwrap();
    assert_eq!(again, c);
    assert_eq!(
        from_toml(&Config::default().to_toml()).unwrap(),
        Config::default()
    );
}

#[test]
fn lowering_the_default_memory_alone_is_a_valid_configuration() {
    // Each run's working directory is `sandbox.workspace_mb` at most half the run's memory,
    // so a low default memory needs no second setting.
    for memory in ["64", "6"] {
        let c = resolve(
            None,
            no_env,
            &[format!("limits.default_memory_mb={memory}")],
        )
        .unwrap_or_else(|e| panic!("--set limits.default_memory_mb={memory}: {e}"));
        assert_eq!(c.limits.default_memory_mb.to_string(), memory);
    }
    let err = resolve(None, no_env, &["sandbox.workspace_mb=0".into()])
        .unwrap_err()
        .to_string();
    assert!(err.contains("sandbox.workspace_mb"), "{err}");
}

#[test]
fn the_defaults_file_reads_back_as_the_defaults_and_names_every_setting() {
    let text = defaults_toml();
    assert_eq!(from_toml(&text).unwrap(), Config::default());
    for s in Config::settings() {
        let key = s.path.rsplit('.').next().unwrap();
        assert!(
            text.lines().any(|l| {
                let l = l.trim_start_matches("# ");
                l.starts_with(&format!("{key} = "))
            }),
            "defaults_toml leaves out {}",
            s.path
        );
    }
    // The commented examples are valid values (the history file and URL exclude each other;
    // the URL's CA file does not exist here).
    let is_setting = |set: &str| {
        set.split_once(" = ").is_some_and(|(k, _)| {
            !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
        })
    };
    let tls = "?sslmode=verify-full&sslrootcert=/etc/codebox/pg-ca.pem";
    assert!(text.contains(tls), "{text}");
    let examples: String = text
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(set) if is_setting(set) && !set.starts_with("path = ") => set,
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace(tls, "");
    let c = from_toml(&examples).unwrap_or_else(|e| panic!("{e}\n{examples}"));
    assert_ne!(c, Config::default());
    for l in text.lines().filter_map(|l| l.strip_prefix("# ")) {
        assert!(
            is_setting(l) || l.len() <= 94,
            "a documentation line is too long: {l}"
        );
    }
}
