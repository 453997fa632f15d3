//! What a new user meets first with `codebox run`, `codebox languages` and the settings:
//! errors that name their source, typos answered with the nearest name, nothing lost or
//! dropped without a word (real Docker where a run happens).

use std::io::Write;
use std::process::{Output, Stdio};

use crate::common::codebox_command;

fn codebox(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = codebox_command();
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run codebox")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn program(dir: &tempfile::TempDir, name: &str, code: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, code).unwrap();
    path.display().to_string()
}

#[test]
fn a_negative_limit_is_a_value_with_the_same_message_as_with_an_equals_sign() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(&dir, "one.py", "print(1)");
    let spaced = codebox(&["run", &p, "--memory-mb", "-5"], &[]);
    let joined = codebox(&["run", &p, "--memory-mb=-5"], &[]);
    assert_eq!(spaced.status.code(), Some(2), "{}", stderr(&spaced));
    assert!(
        stderr(&spaced).contains("limits.memory_mb: must be positive"),
        "{}",
        stderr(&spaced)
    );
    assert_eq!(stderr(&spaced), stderr(&joined));
}

#[test]
fn missing_inputs_name_the_flag_or_variable_they_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(&dir, "one.py", "print(1)");
    let o = codebox(&["run", &p, "--stdin", "nofile.txt"], &[]);
    assert!(
        stderr(&o).contains("--stdin nofile.txt: cannot read it"),
        "{}",
        stderr(&o)
    );
    let o = codebox(
        &["config"],
        &[("CODEBOX_CONFIG", "/nonexistent/codebox.toml")],
    );
    assert!(
        stderr(&o)
            .contains("CODEBOX_CONFIG: the config file /nonexistent/codebox.toml does not exist"),
        "{}",
        stderr(&o)
    );
    let o = codebox(&["--config", "/nonexistent/codebox.toml", "config"], &[]);
    assert!(
        stderr(&o).contains("--config: the config file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn typos_in_variables_and_settings_get_the_nearest_name() {
    let o = codebox(&["config"], &[("CODEBOX_MAX_CONCURENT_RUNS", "2")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "CODEBOX_MAX_CONCURENT_RUNS is not a codebox setting and is ignored; did you mean CODEBOX_MAX_CONCURRENT_RUNS?"
        ),
        "{}",
        stderr(&o)
    );
    // Off a terminal, the warning carries no colour codes.
    assert!(!stderr(&o).contains('\u{1b}'), "{:?}", stderr(&o));
    let o = codebox(&["--set", "runs.max_concurent_runs=2", "config"], &[]);
    assert!(
        stderr(&o).contains("did you mean `runs.max_concurrent_runs`?"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn outputs_naming_a_file_is_refused_before_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(
        &dir,
        "out.py",
        "import os\nos.makedirs('outputs')\nopen('outputs/a.txt', 'w').write('A')\nprint('ran')",
    );
    let file = program(&dir, "f.txt", "taken");
    let o = codebox(&["run", &p, "--outputs", &file], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("--outputs") && stderr(&o).contains("not a folder"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "", "nothing ran");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "taken");
}

#[test]
fn a_run_whose_files_cannot_be_written_still_prints_its_output() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(
        &dir,
        "deep.py",
        "import os\nos.makedirs('outputs/sub')\nopen('outputs/sub/a.txt', 'w').write('A')\nprint('ran')",
    );
    // `sub` is a file in the destination: the folder cannot be made.
    let target = dir.path().join("got");
    std::fs::create_dir(&target).unwrap();
    std::fs::write(target.join("sub"), "in the way").unwrap();
    let o = codebox(&["run", &p, "--outputs", target.to_str().unwrap()], &[]);
    assert_eq!(stdout(&o), "ran\n");
    let err = stderr(&o);
    assert!(
        err.contains("codebox: succeeded (exited with code 0)"),
        "{err}"
    );
    assert!(err.contains("were not all written to"), "{err}");
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn files_left_without_outputs_get_a_hint() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(
        &dir,
        "out.py",
        "import os\nos.makedirs('outputs')\nopen('outputs/a.txt', 'w').write('A')\n",
    );
    let o = codebox(&["run", &p], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("the program left 1 file under outputs/, not kept; pass --outputs DIR"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn the_program_can_come_from_stdin_with_a_language() {
    let run = |args: &[&str]| {
        let mut child = codebox_command()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"print(6 * 7)\n")
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let o = run(&["run", "-", "--language", "python"]);
    assert_eq!(
        (o.status.code(), stdout(&o).as_str()),
        (Some(0), "42\n"),
        "{}",
        stderr(&o)
    );
    let o = run(&["run", "-"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("pass --language"), "{}", stderr(&o));
}

#[test]
fn languages_shows_aliases_and_extensions_in_aligned_columns() {
    let o = codebox(&["languages"], &[]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().take_while(|l| !l.is_empty()).collect();
    let header = lines[0];
    assert!(
        header.contains("ALIASES") && header.contains("EXTENSIONS"),
        "{header}"
    );
    let python = lines.iter().find(|l| l.starts_with("python ")).unwrap();
    assert!(
        python.contains("py, python3") && python.contains(".py"),
        "{python}"
    );
    let image_at = header.find("IMAGE").unwrap();
    for l in &lines[1..] {
        assert!(
            l[image_at..].starts_with("codebox/"),
            "the IMAGE column does not line up: {l}"
        );
    }
    let o = codebox(&["languages", "--json"], &[]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let py = v["languages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["language"] == "python")
        .unwrap();
    assert_eq!(py["extensions"], serde_json::json!(["py"]));
}

#[test]
fn the_compile_error_summary_points_at_the_output_just_printed() {
    let dir = tempfile::tempdir().unwrap();
    let p = program(&dir, "bad.c", "int main(void) { return nope; }\n");
    let o = codebox(&["run", &p], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("nope"),
        "the compiler's output comes first: {err}"
    );
    assert!(!err.contains("compile.stderr"), "{err}");
    assert!(err.contains("its output is above"), "{err}");
}

#[test]
fn run_help_shows_the_configured_defaults_and_maximums() {
    let o = codebox(&["run", "--help"], &[("CODEBOX_DEFAULT_MEMORY_MB", "256")]);
    let text = stdout(&o);
    assert!(
        text.contains("Memory limit in MB (default 256, max 8192)"),
        "{text}"
    );
    assert!(
        text.contains("Wall-clock limit in seconds (default 30, max 3600)"),
        "{text}"
    );
    assert!(
        text.contains("CPU quota in cores (default 1, max 4)"),
        "{text}"
    );
}

/// The history row of the run whose code contains `marker`, as `codebox history --json` says.
fn row_of(marker: &str, data: &std::path::Path) -> Option<serde_json::Value> {
    let o = codebox_command()
        .args(["history", "--json", "--limit", "50"])
        .env("CODEBOX_DATA_DIR", data)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).ok()?;
    v["runs"]
        .as_array()?
        .iter()
        .find(|r| {
            r["code_preview"]
                .as_str()
                .is_some_and(|c| c.contains(marker))
        })
        .cloned()
}

#[test]
fn a_run_in_flight_names_its_process_and_a_sigterm_leaves_its_row_final() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let marker = format!("sigterm-{}", std::process::id());
    let p = program(
        &dir,
        "sleep.py",
        &format!("import time\n# {marker}\ntime.sleep(3000)\n"),
    );
    // The run lasts until the test ends it, however slow the host.
    let child = codebox_command()
        .args(["run", &p, "--timeout-seconds", "3000"])
        .env("CODEBOX_DATA_DIR", &data)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // If an assertion fails first, the run is still stopped (Ctrl-C) and cleans up after itself.
    struct Interrupt(i32);
    impl Drop for Interrupt {
        fn drop(&mut self) {
            // SAFETY: kill(2) on the child this test started (harmless once it exited).
            unsafe { libc::kill(self.0, libc::SIGINT) };
        }
    }
    let interrupt = Interrupt(child.id() as i32);
    let started = std::time::Instant::now();
    loop {
        let row = row_of(&marker, &data);
        if row.as_ref().is_some_and(|r| r["status"] == "running") {
            break;
        }
        if started.elapsed().as_secs() >= 180 {
            drop(interrupt);
            let out = child.wait_with_output().unwrap();
            let history = codebox_command()
                .args(["history", "--json", "--limit", "50"])
                .env("CODEBOX_DATA_DIR", &data)
                .output()
                .unwrap();
            panic!(
                "the run never showed as running; its row: {row:?}; `codebox run` ended with {:?}:\n{}\n`codebox history --json` said: {}{}",
                out.status,
                stderr(&out),
                stdout(&history),
                stderr(&history)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let _interrupt = interrupt;
    // `codebox history` says who holds it.
    let o = codebox_command()
        .args(["history"])
        .env("CODEBOX_DATA_DIR", &data)
        .output()
        .unwrap();
    let table = stdout(&o);
    let line = table
        .lines()
        .find(|l| l.contains("running"))
        .unwrap_or_default();
    assert!(
        line.contains("in flight in codebox process") && line.contains("alive on this host"),
        "{table}"
    );
    // A row that left the queue no longer says it waits for a slot.
    assert!(line.contains("started; not finished yet"), "{table}");
    // SIGTERM: the run is stopped and recorded as such before the process exits.
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    let row = row_of(&marker, &data).unwrap();
    assert_eq!(row["status"], "stopped", "{row}");
    let run_id = row["run_id"].as_str().unwrap().to_string();
    assert!(
        crate::mcp_support::labelled(&run_id).is_empty(),
        "containers left"
    );
}

#[test]
fn config_names_the_language_registry_in_use_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let o = codebox_command()
        .arg("config")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let registry = crate::common::root().join("languages.toml");
    let first = stdout(&o).lines().next().unwrap_or_default().to_string();
    assert_eq!(
        first,
        format!(
            "# language registry in use: {} (set by `languages`: --languages, CODEBOX_LANGUAGES or the config file)",
            registry.display()
        )
    );
}

#[test]
fn without_the_setting_the_registry_is_the_current_folders_else_the_executables_own() {
    let first_line = |c: &mut std::process::Command| {
        let o = c
            .arg("config")
            .env_remove("CODEBOX_LANGUAGES")
            .output()
            .unwrap();
        stdout(&o).lines().next().unwrap_or_default().to_string()
    };
    // The binary in this checkout's target/ reads this checkout's file, from any folder.
    let elsewhere = tempfile::tempdir().unwrap();
    let root = crate::common::root();
    let line = first_line(codebox_command().current_dir(elsewhere.path()));
    assert_eq!(
        line,
        format!(
            "# language registry in use: {} (of the checkout the executable is in ({}))",
            root.join("languages.toml").display(),
            root.display()
        )
    );
    // A languages.toml in the current folder comes first.
    let mine = elsewhere.path().join("languages.toml");
    std::fs::copy(root.join("languages.toml"), &mine).unwrap();
    let line = first_line(codebox_command().current_dir(elsewhere.path()));
    assert_eq!(
        line,
        format!(
            "# language registry in use: {} (in the current folder)",
            mine.display()
        )
    );
    // A copy of the binary with no registry of its own does not fall back to the sources it
    // was built from: it says where it looked and what to set.
    let copy = tempfile::tempdir().unwrap();
    let exe = copy.path().join("codebox");
    std::fs::copy(crate::common::codebox_bin(), &exe).unwrap();
    let empty = tempfile::tempdir().unwrap();
    let o = std::process::Command::new(&exe)
        .arg("languages")
        .env_remove("CODEBOX_LANGUAGES")
        .env_remove("CODEBOX_CONFIG")
        .current_dir(empty.path())
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}{}", stdout(&o));
    assert!(err.contains("no language registry found"), "{err}");
    assert!(
        err.contains(&copy.path().join("languages.toml").display().to_string()),
        "{err}"
    );
    assert!(err.contains("CODEBOX_LANGUAGES"), "{err}");
}
