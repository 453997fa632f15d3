//! Fault injection, each fault on the private daemon (never the machine's own) and each
//! followed by a check that nothing was lost or left: the daemon killed with SIGKILL during a
//! run and restarted; `codebox serve` killed with SIGKILL with runs in flight; a run's
//! container killed from outside; the daemon stopped with SIGSTOP during runs; the history
//! database's disk full; the daemon's disk full.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;

use crate::mcp_support::{eventually, params};
use crate::private_daemon::{lock_files, now, private_daemon, wait_output, Via};

const TOKEN: &str = "fault-test-token-0123456789";

/// A `codebox serve --transport http` child on a free port; killed by PID when dropped. Its
/// log lines are kept.
pub(crate) struct Server {
    child: Child,
    pub addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

pub(crate) type McpClient = rmcp::service::RunningService<rmcp::RoleClient, ()>;

impl Server {
    pub async fn start(command: std::process::Command) -> Server {
        let mut command = tokio::process::Command::from(command);
        let mut child = command
            .args(["serve", "--transport", "http", "--listen", "127.0.0.1:0"])
            .env("CODEBOX_TOKEN", TOKEN)
            .env("CODEBOX_LOG", "info,bollard=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn codebox serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let log = Arc::new(Mutex::new(Vec::new()));
        let addr = loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("server announces its address")
                .unwrap()
                .expect("server exited before serving");
            log.lock().unwrap().push(line.clone());
            if let Some(rest) = line.strip_prefix("codebox: serving MCP at http://") {
                break rest.split('/').next().unwrap().to_string();
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe.
        let kept = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[codebox serve] {line}");
                kept.lock().unwrap().push(line);
            }
        });
        Server { child, addr, log }
    }

    fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    pub async fn kill(mut self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), signal) };
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }

    pub async fn client(&self) -> McpClient {
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(TOKEN),
        );
        ().serve(t).await.expect("MCP over HTTP")
    }

    /// Log lines so far that contain `text`.
    fn logged(&self, text: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(text))
            .count()
    }
}

pub(crate) async fn tool(client: &McpClient, name: &'static str, args: Value) -> Value {
    let res = client
        .call_tool(params(name, args.clone()))
        .await
        .unwrap_or_else(|e| panic!("{name}({args}): {e}"));
    assert_ne!(res.is_error, Some(true), "{name}({args}): {res:?}");
    res.structured_content.expect("structured content")
}

pub(crate) fn bash(code: &str, timeout_seconds: f64) -> Value {
    json!({"language": "bash", "code": code, "limits": {"timeout_seconds": timeout_seconds}})
}

/// A file in `dir` holding `code`.
fn program(dir: &std::path::Path, name: &str, code: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, code).unwrap();
    path
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: stdout {:?}, stderr {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[tokio::test]
async fn dockerd_killed_mid_run_gives_sandbox_error_and_a_history_row_and_the_next_start_reaps_at_once(
) {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (child, left) = daemon
        .start_sleeper(Via::Socket, data.path(), work.path())
        .await;
    let killed = Instant::now();
    daemon.signal(libc::SIGKILL);

    // codebox ends by itself, without the daemon.
    let out = wait_output(child, Duration::from_secs(60)).await;
    let took = killed.elapsed();
    assert_eq!(out.status.code(), Some(125), "exit status of sandbox_error");
    let report = json_of(&out);
    assert_eq!(report["status"], "sandbox_error", "{report}");
    let message = report["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("Docker is not reachable at {}", daemon.socket())),
        "{message}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("some containers could not be removed; the next start reaps them"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(45), "took {took:?}");
    // What main now does when removals fail: the lock file stays, so the instance is known
    // to be dead (not unknown) at the next start.
    assert_eq!(
        lock_files(data.path()).len(),
        1,
        "the instance's lock file was kept"
    );

    // The run has its history row (no daemon needed to read it).
    let out = daemon
        .codebox(Via::Socket, data.path())
        .args(["history", "--json"])
        .output()
        .unwrap();
    let rows = json_of(&out)["runs"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["run_id"], report["run_id"]);
    assert_eq!(rows[0]["status"], "sandbox_error");
    assert_eq!(rows[0]["message"], message);

    daemon.restart();
    assert_eq!(
        daemon.containers(&format!("id={left}")).len(),
        1,
        "the restarted daemon still has the run's container"
    );
    let expires: u64 = daemon.label(&left, "codebox.expires").parse().unwrap();
    assert!(expires > now() + 300, "not reaped for being expired");

    daemon.run_hello(Via::Socket, data.path(), work.path());
    assert!(
        daemon.containers("label=codebox.managed=true").is_empty(),
        "the next start removed the dead run's container at once"
    );
    assert!(lock_files(data.path()).is_empty());
}

#[tokio::test]
async fn serve_killed_with_sigkill_mid_runs_is_reaped_and_its_runs_marked_interrupted_at_the_next_start(
) {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let serve = || {
        let mut c = daemon.codebox(Via::Socket, data.path());
        // One ready container whatever the demand, so that the count below is exact.
        c.args(["--set", "pool.sizes={ bash = 1 }"]);
        c.args(["--set", "pool.max_ready={ bash = 1 }"]);
        c
    };
    let server = Server::start(serve()).await;
    let client = server.client().await;
    let mut ids = Vec::new();
    for _ in 0..2 {
        let started = tool(&client, "start_run", bash("sleep 600", 900.0)).await;
        ids.push(started["run_id"].as_str().unwrap().to_string());
    }
    // Two runs and the pool's ready container (taken containers are replaced).
    eventually(60, "two runs and a pooled container run", || {
        daemon.running("label=codebox.managed=true").len() == 3
    })
    .await;
    let dead: Vec<String> = daemon.containers("label=codebox.managed=true");
    let instance = daemon.label(&dead[0], "codebox.instance");
    drop(client);
    server.kill(libc::SIGKILL).await;
    assert_eq!(
        daemon
            .containers(&format!("label=codebox.instance={instance}"))
            .len(),
        3,
        "a killed server cannot clean up"
    );

    let server = Server::start(serve()).await;
    eventually(30, "the dead server's containers are removed", || {
        daemon
            .containers(&format!("label=codebox.instance={instance}"))
            .is_empty()
    })
    .await;
    let client = server.client().await;
    let runs = tool(&client, "get_execution_history", json!({"limit": 10})).await["runs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(runs.len(), 2);
    for r in &runs {
        assert!(ids.contains(&r["run_id"].as_str().unwrap().to_string()));
        assert_eq!(r["status"], "sandbox_error", "{r}");
        assert_eq!(r["message"], "interrupted by server restart", "{r}");
    }
    let metrics = reqwest::Client::new()
        .get(format!("http://{}/metrics", server.addr))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let reaped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("codebox_containers_reaped_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(reaped, 3, "both runs' containers and the pooled one");
    drop(client);
    server.kill(libc::SIGTERM).await;
    assert!(
        daemon.containers("label=codebox.managed=true").is_empty(),
        "the second server removed its own pool at exit"
    );
}

#[tokio::test]
async fn a_container_killed_from_outside_is_a_clear_sandbox_error_and_is_removed() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let (child, container) = daemon
        .start_sleeper(Via::Socket, data.path(), work.path())
        .await;
    let killed = Instant::now();
    let out = daemon.docker(&["kill", &container]);
    assert!(out.status.success());
    let out = wait_output(child, Duration::from_secs(60)).await;
    assert!(killed.elapsed() < Duration::from_secs(10));
    assert_eq!(out.status.code(), Some(125));
    let report = json_of(&out);
    assert_eq!(report["status"], "sandbox_error", "{report}");
    assert_eq!(report["stdout"], "started\n", "{report}");
    assert!(
        report["message"].as_str().unwrap().starts_with(
            "the container was killed by SIGKILL (exit code 137) before codebox-init reported: something outside codebox ended it"
        ),
        "{report}"
    );
    assert!(
        daemon.containers("label=codebox.managed=true").is_empty(),
        "the killed container was removed"
    );
    assert!(lock_files(data.path()).is_empty(), "a clean exit");
}

#[tokio::test]
async fn with_the_daemon_stopped_deadlines_hold_get_result_answers_and_nothing_is_lost() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let mut command = daemon.codebox(Via::Socket, data.path());
    command.args(["--set", "pool.sizes={}"]);
    let server = Server::start(command).await;
    let client = server.client().await;
    // The stated grace: the host's backstop (5 s), then at most END_GRACE (10 s) waiting
    // for a daemon that does not answer.
    let grace = Duration::from_secs(5) + codebox::executor::stage::END_GRACE;
    // Two runs whose programs outlive their 2 s limit, and one that ends in time (while the
    // daemon is stopped, so its report can only come out once the daemon is back).
    let mut overrun = Vec::new();
    for _ in 0..2 {
        let r = tool(&client, "start_run", bash("echo started; sleep 60", 2.0)).await;
        overrun.push((r["run_id"].as_str().unwrap().to_string(), Instant::now()));
    }
    let r = tool(
        &client,
        "start_run",
        bash("echo started; sleep 3; echo done", 60.0),
    )
    .await;
    let in_time = r["run_id"].as_str().unwrap().to_string();
    let all: Vec<&String> = overrun.iter().map(|(id, _)| id).chain([&in_time]).collect();
    eventually(60, "the three programs run", || {
        all.iter()
            .all(|id| daemon.running(&format!("label=codebox.run={id}")).len() == 1)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Stopped for longer than the overrunning runs' limit and grace.
    daemon.signal(libc::SIGSTOP);
    let stopped = Instant::now();
    let mut answers = 0;
    let mut ended_while_stopped = std::collections::BTreeMap::new();
    while stopped.elapsed() < Duration::from_secs(20) {
        for id in &all {
            let asked = Instant::now();
            let r = tokio::time::timeout(
                Duration::from_secs(2),
                tool(&client, "get_result", json!({"run_id": id})),
            )
            .await
            .expect("get_result answers while the daemon is stopped");
            assert!(asked.elapsed() < Duration::from_secs(2));
            answers += 1;
            if r["status"] != "running" {
                ended_while_stopped.entry(id.to_string()).or_insert(r);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    daemon.signal(libc::SIGCONT);
    assert!(answers >= 60, "{answers} answers");

    for (id, started) in &overrun {
        let r = ended_while_stopped
            .get(id)
            .unwrap_or_else(|| panic!("run {id} did not end while the daemon was stopped"));
        assert_eq!(r["status"], "sandbox_error", "{r}");
        assert!(
            r["message"]
                .as_str()
                .unwrap()
                .starts_with("Docker stopped answering"),
            "{r}"
        );
        assert_eq!(
            r["stdout"], "started\n",
            "output before the stop is kept: {r}"
        );
        let limit = Duration::from_secs(2);
        assert!(
            Duration::from_millis(r["duration_ms"].as_u64().unwrap())
                <= limit + grace + Duration::from_secs(1),
            "{r}"
        );
        assert!(started.elapsed() > limit + grace, "{r}");
    }
    assert!(!ended_while_stopped.contains_key(&in_time));
    let r = tool(
        &client,
        "get_result",
        json!({"run_id": in_time, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{r}");
    assert_eq!(r["stdout"], "started\ndone\n", "{r}");

    for id in &all {
        eventually(30, "the runs' containers are removed", || {
            daemon
                .containers(&format!("label=codebox.run={id}"))
                .is_empty()
        })
        .await;
    }
    drop(client);
    server.kill(libc::SIGTERM).await;
}

/// A tmpfs mounted for one test, unmounted when dropped (a failing test included).
struct Mount(std::path::PathBuf);

impl Mount {
    fn tmpfs(dir: &std::path::Path, size: &str) -> Mount {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "codebox-test"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "mount: {out:?}");
        Mount(dir.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // A killed server may still hold the database open for a moment.
        for _ in 0..50 {
            let done = std::process::Command::new("umount").arg(&self.0).status();
            if done.is_ok_and(|s| s.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[tokio::test]
async fn with_the_history_disk_full_runs_succeed_and_one_warning_is_logged() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let disk = tempfile::tempdir().unwrap();
    let mount = Mount::tmpfs(disk.path(), "1m");
    let mut command = daemon.codebox(Via::Socket, data.path());
    command.args([
        "--set",
        "pool.sizes={}",
        "--set",
        &format!("history.path={}/history.sqlite3", disk.path().display()),
    ]);
    let server = Server::start(command).await;
    let client = server.client().await;
    let first = tool(&client, "run_code", bash("echo one", 10.0)).await;
    assert_eq!(first["status"], "succeeded");

    // Fill the history's disk.
    let filler = disk.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 4096];
        while f.write_all(&chunk).and_then(|_| f.flush()).is_ok() {}
    }
    let mut ids = Vec::new();
    for i in 0..5 {
        let r = tool(&client, "run_code", bash(&format!("echo {i}"), 10.0)).await;
        assert_eq!(r["status"], "succeeded", "{r}");
        assert_eq!(r["stdout"], format!("{i}\n"));
        ids.push(r["run_id"].as_str().unwrap().to_string());
    }
    // Reports stay available from memory.
    for id in &ids {
        let r = tool(&client, "get_result", json!({"run_id": id})).await;
        assert_eq!(r["status"], "succeeded");
    }
    eventually(10, "the failure is logged", || {
        server.logged("writing the run history failed") == 1
    })
    .await;

    // Room again: history records again.
    std::fs::remove_file(&filler).unwrap();
    let last = tool(&client, "run_code", bash("echo again", 10.0)).await;
    assert_eq!(last["status"], "succeeded");
    let rows = tool(&client, "get_execution_history", json!({"limit": 10})).await["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert!(rows.contains(&first["run_id"].as_str().unwrap().to_string()));
    assert!(rows.contains(&last["run_id"].as_str().unwrap().to_string()));
    assert_eq!(
        server.logged("writing the run history failed"),
        1,
        "one warning for the whole outage, not one per run"
    );
    drop(client);
    server.kill(libc::SIGTERM).await;
    let left = daemon.containers("label=codebox.managed=true");
    assert!(
        left.is_empty(),
        "{left:?}: {}",
        String::from_utf8_lossy(
            &daemon
                .docker(&["ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Labels}}"])
                .stdout
        )
    );
    drop(mount);
}

/// Gives the private daemon its disk back when dropped.
struct Unfill<'a>(&'a crate::private_daemon::PrivateDaemon);

impl Drop for Unfill<'_> {
    fn drop(&mut self) {
        self.0.fill_disk(false);
    }
}

#[tokio::test]
async fn with_the_daemons_disk_full_builds_and_runs_fail_clearly_and_recover() {
    let (_alone, daemon) = private_daemon().await;
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let hello = program(work.path(), "hello.sh", "echo hello\n");
    daemon.fill_disk(true);
    let unfill = Unfill(daemon);

    let out = daemon
        .codebox(Via::Socket, data.path())
        .args(["images", "build", "bash", "--no-cache"])
        .args(["--set", "docker.build_network=host"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("codebox: building image codebox/bash:5.2 failed")
            && last.contains("no space left on device"),
        "{stderr}"
    );

    let out = daemon
        .codebox(Via::Socket, data.path())
        .arg("run")
        .arg(&hello)
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let report = json_of(&out);
    assert_eq!(report["status"], "sandbox_error");
    assert!(
        report["message"]
            .as_str()
            .unwrap()
            .contains("no space left on device"),
        "{report}"
    );
    let left = daemon.containers("label=codebox.managed=true");
    assert!(
        left.is_empty(),
        "{left:?}: {}",
        String::from_utf8_lossy(
            &daemon
                .docker(&["ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Labels}}"])
                .stdout
        )
    );

    drop(unfill);
    daemon.run_hello(Via::Socket, data.path(), work.path());
    let left = daemon.containers("label=codebox.managed=true");
    assert!(
        left.is_empty(),
        "{left:?}: {}",
        String::from_utf8_lossy(
            &daemon
                .docker(&["ps", "-a", "--format", "{{.Names}} {{.Status}} {{.Labels}}"])
                .stdout
        )
    );
}
