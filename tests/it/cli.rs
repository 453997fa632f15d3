//! The `codebox` binary as a person (or CI) uses it.

use std::process::Output;

use codebox::report::{RunReport, Status};

use crate::common::root;

fn codebox(args: &[&str]) -> Output {
    crate::common::codebox_command()
        .args(args)
        .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .env_remove("CODEBOX_CONFIG")
        .output()
        .expect("run codebox")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn write_temp(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn run_prints_output_and_mirrors_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write_temp(&dir, "ok.py", "import sys\nprint('hi', sys.argv[1:])");
    let out = codebox(&["run", &ok, "--", "x", "y"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi ['x', 'y']\n");

    let three = write_temp(&dir, "three.cpp", "int main() { return 3; }");
    let out = codebox(&["run", &three]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("failed (exited with code 3)"));
}

#[test]
fn a_java_file_runs_under_the_name_of_its_public_class() {
    let dir = tempfile::tempdir().unwrap();
    let hello = write_temp(
        &dir,
        "Hello.java",
        "public class Hello {\n    public static void main(String[] a) { System.out.println(\"hello from \" + Hello.class.getName()); }\n}\n",
    );
    let out = codebox(&["run", &hello]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hello from Hello\n");
}

#[test]
fn run_json_prints_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let file = write_temp(
        &dir,
        "echo.txt",
        "import sys; print(sys.stdin.read().upper(), end='')",
    );
    let input = write_temp(&dir, "in.txt", "shout\n");
    let out = codebox(&[
        "run",
        &file,
        "--language",
        "py",
        "--stdin",
        &input,
        "--json",
        "--memory-mb",
        "128",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let report: RunReport = serde_json::from_slice(&out.stdout).expect("report JSON");
    assert_eq!(report.status, Status::Succeeded);
    assert_eq!(report.stdout, "SHOUT\n");
    assert_eq!(report.limits.memory_mb, 128);
}

#[test]
fn run_reports_compile_errors_and_timeouts_by_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let bad = write_temp(&dir, "bad.py", "def f(:\n");
    let out = codebox(&["run", &bad]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("SyntaxError"),
        "{}",
        text(&out.stderr)
    );
    let slow = write_temp(&dir, "slow.py", "while True: pass");
    let out = codebox(&["run", &slow, "--timeout-seconds", "1"]);
    assert_eq!(out.status.code(), Some(124), "{}", text(&out.stderr));
}

#[test]
fn run_rejects_limits_over_the_ceiling() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write_temp(&dir, "ok.py", "print(1)");
    let out = codebox(&["run", &ok, "--memory-mb", "32768"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .contains("limits.memory_mb: requested 32768 MB of memory; the maximum is 8192 MB"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn unreachable_docker_is_one_clear_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let ok = write_temp(&dir, "ok.py", "print(1)");
    let out = crate::common::codebox_command()
        .args(["run", &ok, "--json"])
        .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let report: RunReport = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report.status, Status::SandboxError);
    assert!(report.message.starts_with("Docker is not reachable at unix:///nonexistent/docker.sock: start the daemon or set DOCKER_HOST"), "{}", report.message);

    let out = crate::common::codebox_command()
        .arg("doctor")
        .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("Docker is not reachable at unix:///nonexistent/docker.sock"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn doctor_verifies_the_posture_from_inside() {
    // Under the suite's runtime: scripts/test runs this again with CODEBOX_TEST_RUNTIME=runsc.
    let runtime = crate::common::test_runtime();
    let out = codebox(&["doctor", "--set", &format!("sandbox.runtime={runtime}")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let gvisor = crate::common::gvisor();
    for line in [
        "runs as uid 100",
        "no capabilities (CapEff 0000000000000000)",
        if gvisor {
            "no new privileges: set in the container's spec"
        } else {
            "no new privileges (NoNewPrivs 1)"
        },
        "network interfaces: lo (only lo allowed)",
        if gvisor {
            "kernel: gvisor"
        } else {
            "kernel: host"
        },
        "root filesystem is readonly",
        &format!("runtime `{runtime}` (sandbox.runtime) is registered"),
    ] {
        assert!(stdout.contains(line), "missing `{line}` in:\n{stdout}");
    }
}

#[test]
fn languages_json_lists_every_language_with_its_image() {
    let out = codebox(&["languages", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let langs = v["languages"].as_array().unwrap();
    assert!(langs.len() >= 14);
    let py = langs.iter().find(|l| l["language"] == "python").unwrap();
    assert_eq!(py["image"], "codebox/python:3.11");
    assert_eq!(py["image_present"], true);
    assert_eq!(py["compiled"], true);
    assert_eq!(
        v["limits"]["ceilings"]["memory_mb"], 8192,
        "the budget, below the setting"
    );
}

const AWK_REGISTRY: &str = r#"
[images.bash]
tag = "codebox/bash:5.2"
context = "images/bash"

[languages.awk]
display_name = "AWK (mawk)"
aliases = ["mawk"]
image = "bash"
source_file = "main.awk"
run = ["mawk", "-f", "main.awk"]
version = ["mawk", "-W", "version"]

[[languages.awk.tests]]
name = "hello"
code = 'BEGIN { print "hello" }'
expect = { status = "succeeded", stdout = "hello\n" }

[[languages.awk.tests]]
name = "stdin"
code = '{ print "got " $0 }'
stdin = "abc\n"
expect = { status = "succeeded", stdout = "got abc\n" }

[[languages.awk.tests]]
name = "exit"
code = 'BEGIN { exit 3 }'
expect = { status = "failed", exit_code = 3 }

[[languages.awk.tests]]
name = "runtime_error"
code = 'BEGIN { print "x" > "/usr/out" }'
expect = { status = "failed", stderr_contains = "/usr/out" }
"#;

#[test]
fn adding_a_language_needs_no_rust_change() {
    let dir = tempfile::tempdir().unwrap();
    let registry = write_temp(&dir, "languages.toml", AWK_REGISTRY);
    let run = |args: &[&str]| {
        crate::common::codebox_command()
            .args(args)
            .env("CODEBOX_LANGUAGES", &registry)
            .output()
            .unwrap()
    };
    let out = run(&["smoke", "awk"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.ends_with("4 passed, 0 failed\n"), "{stdout}");

    let prog = write_temp(&dir, "sum.awk", "{ s += $1 } END { print s }");
    let input = write_temp(&dir, "nums.txt", "1\n2\n39\n");
    let out = run(&["run", &prog, "--stdin", &input]);
    assert_eq!(text(&out.stdout), "42\n", "{}", text(&out.stderr));

    let out = run(&["languages"]);
    assert!(text(&out.stdout).contains("AWK (mawk)"));
}

#[test]
fn a_registry_with_an_unknown_field_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let registry = write_temp(
        &dir,
        "languages.toml",
        &AWK_REGISTRY.replace("source_file", "colour = 1\nsource_file"),
    );
    let out = crate::common::codebox_command()
        .arg("languages")
        .env("CODEBOX_LANGUAGES", &registry)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("languages.toml") && err.contains("`awk`") && err.contains("colour"),
        "{err}"
    );
}

#[test]
// The child is reaped by wait4 below, which also reports its peak memory.
#[allow(clippy::zombie_processes)]
fn printing_a_gigabyte_keeps_codebox_memory_bounded() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let big = write_temp(
        &dir,
        "big.py",
        "import sys\nchunk = b'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.buffer.write(chunk)\n",
    );
    let mut child = crate::common::codebox_command()
        .args(["run", &big, "--json", "--timeout-seconds", "300"])
        .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    // wait4 gives this one child's peak resident set size.
    let mut status = 0;
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32);
    let report: RunReport = serde_json::from_str(&out).unwrap();
    assert_eq!(report.status, Status::Succeeded, "{}", report.message);
    assert_eq!(report.stdout_bytes, 1 << 30);
    assert!(report.stdout_truncated);
    assert_eq!(report.stdout.len(), 1 << 20);
    let peak_mb = usage.ru_maxrss / 1024;
    assert!(
        peak_mb < 64,
        "codebox peaked at {peak_mb} MB while relaying 1 GiB (cap 1 MiB)"
    );
}

#[test]
fn run_outputs_writes_the_returned_files_into_a_folder() {
    let dir = tempfile::tempdir().unwrap();
    let prog = write_temp(
        &dir,
        "out.py",
        "import os\nos.makedirs('outputs/sub')\nopen('outputs/a.txt', 'w').write('A')\nopen('outputs/sub/b.bin', 'wb').write(bytes(range(256)))\n",
    );
    let target = dir.path().join("got");
    let out = crate::common::codebox_command()
        .args(["run", &prog, "--outputs", target.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read(target.join("a.txt")).unwrap(), b"A");
    assert_eq!(
        std::fs::read(target.join("sub/b.bin")).unwrap(),
        (0..=255u8).collect::<Vec<u8>>()
    );
    // `--json` keeps the bytes in the report (only MCP sends them as content blocks).
    let out = codebox(&["run", &prog, "--json"]);
    let report: RunReport = serde_json::from_slice(&out.stdout).expect("report JSON");
    let a = report.files.iter().find(|f| f.path == "outputs/a.txt");
    assert_eq!(
        a.and_then(|f| f.content_base64.as_deref()),
        Some("QQ=="),
        "{:?}",
        report.files
    );
}

#[test]
fn run_says_which_outputs_are_not_listed() {
    use crate::workspace::{deep_folder, DEEP_AND_MANY, MANY_REASON};
    let dir = tempfile::tempdir().unwrap();
    let prog = write_temp(&dir, "many.py", DEEP_AND_MANY);
    let out = codebox(&["run", &prog]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("succeeded (exited with code 0; not everything under outputs/ is listed: ")
            && err.contains(&deep_folder())
            && err.contains(MANY_REASON),
        "{err}"
    );
    let out = codebox(&["run", &prog, "--json"]);
    let report: RunReport = serde_json::from_slice(&out.stdout).expect("report JSON");
    let many = report.files.iter().find(|f| f.path == "outputs/many");
    assert_eq!(
        many.and_then(|f| f.omitted_reason.as_deref()),
        Some(MANY_REASON),
        "{:?}",
        report.files.last()
    );
}

#[test]
fn a_uid_another_codebox_process_holds_is_never_leased() {
    // Another process (this test) holds the locks of 63 of the 64 sandbox users in the data
    // directory the binary uses: its run must get the remaining one.
    let data = tempfile::tempdir().unwrap();
    let locks = data.path().join("uids");
    std::fs::create_dir_all(&locks).unwrap();
    let free_uid = 10001 + (std::process::id() % 64);
    let held: Vec<std::fs::File> = (10001..=10064)
        .filter(|u| *u != free_uid)
        .map(|u| {
            let f = std::fs::File::create(locks.join(format!("{u}.lock"))).unwrap();
            f.lock().unwrap();
            f
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let prog = write_temp(&dir, "uid.py", "import os\nprint(os.getuid())\n");
    let out = crate::common::codebox_command()
        .env("CODEBOX_DATA_DIR", data.path())
        .args(["run", &prog])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{free_uid}\n"));
    drop(held);
}

/// `codebox repl LANG` with this stdin (not a terminal: the whole input is one cell).
fn repl(language: &str, stdin: &str) -> std::process::Child {
    repl_spawn(language, stdin, None)
}

/// `codebox repl LANGUAGE` fed `stdin`, with its data in `data` when given.
fn repl_spawn(language: &str, stdin: &str, data: Option<&std::path::Path>) -> std::process::Child {
    use std::io::Write as _;
    let mut command = crate::common::codebox_command();
    command
        .args(["repl", language])
        .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
        .env_remove("CODEBOX_CONFIG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(data) = data {
        command.env("CODEBOX_DATA_DIR", data);
    }
    let mut child = command.spawn().expect("run codebox repl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child
}

#[test]
fn repl_runs_piped_code_as_one_cell_and_echoes_its_value() {
    let out = repl("python", "x = 41\nprint('hi')\nx + 1\n")
        .wait_with_output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "hi\n42\n");
    let err = text(&out.stderr);
    assert!(
        err.contains("[succeeded") && err.contains("state new"),
        "{err}"
    );
    let out = repl("python", "1 / 0\n").wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("ZeroDivisionError"));
}

#[test]
fn ctrl_c_interrupts_the_running_cell_of_a_repl() {
    let child = repl(
        "python",
        "import subprocess\nprint('a', flush=True)\nsubprocess.run(['sleep', '61'])\n",
    );
    let pid = child.id() as i32;
    // `sleep 61` runs in a session's container once the cell has printed.
    let sleeping = || {
        crate::common::labelled_objects("label=codebox.run=session")
            .iter()
            .any(|id| {
                let top = std::process::Command::new("docker")
                    .args(["top", id])
                    .output()
                    .unwrap();
                text(&top.stdout).contains("sleep 61")
            })
    };
    for _ in 0..600 {
        if sleeping() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(sleeping(), "the cell never ran");
    // SAFETY: kill(2) on our own child's PID.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "a\n");
    let err = text(&out.stderr);
    assert!(err.contains("[stopped"), "{err}");
}

/// `codebox repl python` on this data directory with this stdin; its output.
fn repl_in(data: &std::path::Path, stdin: &str) -> Output {
    repl_spawn("python", stdin, Some(data))
        .wait_with_output()
        .unwrap()
}

#[test]
fn repl_prints_its_session_id_and_history_takes_a_unique_prefix_of_it() {
    let data = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    for n in [1, 2] {
        let out = repl_in(data.path(), &format!("print({n})\n"));
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{err}");
        let id = err
            .split_whitespace()
            .find(|w| w.starts_with("cbx_"))
            .unwrap_or_else(|| panic!("codebox repl printed no session id: {err}"))
            .to_string();
        ids.push(id);
    }
    let history = |session: &str| {
        crate::common::codebox_command()
            .args(["history", "--session", session])
            .env("CODEBOX_DATA_DIR", data.path())
            .env_remove("CODEBOX_CONFIG")
            .output()
            .unwrap()
    };
    // The whole id and a unique prefix give that session's execution.
    let short = &ids[0][..ids[0]
        .char_indices()
        .zip(ids[1].chars())
        .find(|((_, a), b)| a != b)
        .map(|((i, _), _)| i + 1)
        .unwrap()];
    for session in [ids[0].as_str(), short] {
        let out = history(session);
        let table = text(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert_eq!(table.lines().count(), 2, "--session {session}: {table}");
        assert!(
            table.contains(&ids[0][..10]),
            "--session {session}: {table}"
        );
    }
    // A prefix of both is refused, naming both; an unknown id is an error, not "no runs".
    let out = history("cbx_");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("2 session ids") && err.contains(&ids[1]),
        "{err}"
    );
    let out = history("cbx_nope");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no session id starts with `cbx_nope`"),
        "{err}"
    );
}
