//! A remote Docker daemon over TLS: the private daemon on `tcp://127.0.0.1:PORT` with
//! `--tlsverify` serves every command (run, doctor, images, the reaper; the images themselves
//! were built over TLS by the fixture), set by the docker CLI's variables or by the config
//! file's `[docker]` section. Without a client certificate the daemon refuses, and codebox
//! says so in one sentence.

use std::time::Duration;

use codebox::engine::docker::DockerEngine;
use codebox::engine::ContainerEngine;

use serde_json::json;

use crate::faults::{bash, tool, Server};
use crate::private_daemon::{lock_files, now, private_daemon, wait_output, Via};

#[tokio::test]
async fn run_doctor_and_images_work_over_tls_from_the_variables_or_the_config_file() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let program = work.path().join("main.sh");
    std::fs::write(
        &program,
        "read -r line; echo \"got $line from $(hostname)\"; echo \"args: $*\"\nmkdir -p outputs; printf 'made remotely' > outputs/note.txt\n",
    )
    .unwrap();
    let stdin = work.path().join("in.txt");
    std::fs::write(&stdin, "abc\n").unwrap();
    let outputs = work.path().join("out");

    // DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH, as the docker CLI takes them.
    let out = daemon
        .codebox(Via::Tls, data.path())
        .arg("run")
        .arg(&program)
        .arg("--stdin")
        .arg(&stdin)
        .arg("--outputs")
        .arg(&outputs)
        .args(["--json", "--", "one", "two"])
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(report["status"], "succeeded", "{report}");
    assert_eq!(report["stdout"], "got abc from sandbox\nargs: one two\n");
    assert_eq!(
        std::fs::read_to_string(outputs.join("note.txt")).unwrap(),
        "made remotely",
        "a file the program saved comes back from the remote daemon"
    );
    assert!(
        daemon
            .containers(&format!(
                "label=codebox.run={}",
                report["run_id"].as_str().unwrap()
            ))
            .is_empty(),
        "the run's container was removed from the remote daemon"
    );

    // The same daemon from the config file alone: no DOCKER_* variable is set.
    let config = work.path().join("codebox.toml");
    std::fs::write(
        &config,
        format!(
            "[docker]\nhost = \"{}\"\ntls_verify = true\ncert_path = \"{}\"\n",
            daemon.tcp(),
            daemon.certs().display()
        ),
    )
    .unwrap();
    let from_file = || {
        let mut c = daemon.codebox(Via::Tls, data.path());
        c.env_remove("DOCKER_HOST")
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .arg("--config")
            .arg(&config);
        c
    };
    let out = from_file().arg("doctor").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&format!("reachable at {}", daemon.tcp())),
        "{text}"
    );
    assert!(text.contains("root filesystem is readonly"), "{text}");
    assert!(text.ends_with(" passed, 0 failed\n"), "{text}");

    let out = from_file()
        .args(["images", "list", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let present: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["present"] == true)
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(present, ["base", "bash"], "{list}");
    assert!(list[1]["versions"]["bash"]
        .as_str()
        .unwrap()
        .starts_with("GNU bash"));

    let out = from_file().arg("smoke").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.ends_with(" passed, 0 failed\n"), "{text}");

    // And in-process, through the engine the settings name.
    let engine = DockerEngine::connect(&daemon.settings(Via::Tls)).unwrap();
    assert_eq!(engine.ping().await.unwrap().address, daemon.tcp());
}

#[tokio::test]
async fn serve_runs_code_over_tls() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let mut command = daemon.codebox(Via::Tls, data.path());
    command.args(["--set", "pool.sizes={ bash = 1 }"]);
    let server = Server::start(command).await;
    let client = server.client().await;
    let languages = tool(&client, "list_supported_languages", json!({})).await;
    assert_eq!(
        languages["languages"][0]["image_present"], true,
        "{languages}"
    );
    let r = tool(&client, "run_code", bash("echo remote; cat", 10.0)).await;
    assert_eq!(r["status"], "succeeded", "{r}");
    assert_eq!(r["stdout"], "remote\n");
    let started = tool(&client, "start_run", bash("sleep 1; echo later", 10.0)).await;
    let id = started["run_id"].as_str().unwrap();
    let r = tool(
        &client,
        "get_result",
        json!({"run_id": id, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(
        (r["status"].as_str(), r["stdout"].as_str()),
        (Some("succeeded"), Some("later\n"))
    );
    drop(client);
    server.kill(libc::SIGTERM).await;
    assert!(
        daemon.containers("label=codebox.managed=true").is_empty(),
        "the server removed its runs' and its pool's containers on the remote daemon"
    );
}

#[tokio::test]
async fn over_tls_the_next_start_removes_what_a_killed_codebox_left() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (child, left) = daemon
        .start_sleeper(Via::Tls, data.path(), work.path())
        .await;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    wait_output(child, Duration::from_secs(30)).await;
    let expires: u64 = daemon.label(&left, "codebox.expires").parse().unwrap();
    assert!(
        expires > now() + 300,
        "the container is not expired: only the dead instance's lock says it is abandoned"
    );
    assert_eq!(
        lock_files(data.path()).len(),
        1,
        "the killed instance's lock file"
    );
    assert_eq!(daemon.containers(&format!("id={left}")).len(), 1);

    daemon.run_hello(Via::Tls, data.path(), work.path());
    assert!(
        daemon.containers(&format!("id={left}")).is_empty(),
        "the dead instance's container was reaped at the next start, over TLS"
    );
    assert!(daemon.containers("label=codebox.managed=true").is_empty());
    assert!(
        lock_files(data.path()).is_empty(),
        "the dead instance is forgotten once its container is gone"
    );
}

#[tokio::test]
async fn without_a_client_certificate_the_daemon_refuses_and_codebox_says_so_in_one_sentence() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let nocert = daemon.certs_without_client();
    let expected = format!(
        "Docker at {} refused the connection: it requires a TLS client certificate, and there is none at {}/cert.pem (set docker.cert_path or DOCKER_CERT_PATH to a folder holding ca.pem, cert.pem and key.pem)",
        daemon.tcp(),
        nocert.display()
    );

    let out = daemon
        .codebox(Via::Tls, data.path())
        .env("DOCKER_CERT_PATH", &nocert)
        .arg("doctor")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    // After the line naming the language registry in use.
    let (registry, rest) = text.split_once('\n').unwrap_or_default();
    assert!(registry.starts_with("Language registry: "), "{text}");
    assert_eq!(
        rest,
        format!("Docker:\n  FAIL {expected}\n0 passed, 1 failed\n")
    );

    let work = tempfile::tempdir().unwrap();
    let hello = work.path().join("hello.sh");
    std::fs::write(&hello, "echo hello\n").unwrap();
    let out = daemon
        .codebox(Via::Tls, data.path())
        .env("DOCKER_CERT_PATH", &nocert)
        .arg("run")
        .arg(&hello)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "sandbox_error");
    assert_eq!(report["message"], expected.as_str());

    // It is the daemon that refused: it says so in its own log.
    assert!(
        daemon
            .log()
            .contains("tls: client didn't provide a certificate"),
        "the daemon's log does not show the refusal"
    );
}
