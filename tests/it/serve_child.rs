//! The real `codebox serve` binary as a child process with a data directory of its own, for
//! the tests that treat it as a black box (crash, fuzzing, load): its instance id (so
//! `docker ps` can be asked about exactly its containers), its peak memory, and whether it
//! still runs. Dropped while it still runs (a test failed), it is stopped with SIGTERM so
//! that it removes its containers (the pool's too), and killed only if that takes too long.

#![allow(dead_code)]

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::common::{codebox_bin, root};

/// Lines of the child's stderr kept for a failure message.
const STDERR_TAIL: usize = 200;

/// What the child wrote on stderr: the last lines, and the lines that report a panic.
#[derive(Default)]
pub struct StderrLog {
    pub tail: std::collections::VecDeque<String>,
    pub panics: Vec<String>,
    pub lines: usize,
}

/// A running `codebox serve`.
pub struct ServeChild {
    pub child: Child,
    /// Its data directory (history database, instance lock); removed with the value unless
    /// taken by [`ServeChild::into_data`].
    data: Option<tempfile::TempDir>,
    /// `host:port` with `--transport http`.
    pub addr: Option<String>,
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Arc<Mutex<StderrLog>>,
}

/// How to start it.
pub struct Options<'a> {
    /// `--transport http` with this bearer token; `None`: stdio.
    pub http_token: Option<&'a str>,
    /// `--set SETTING=VALUE` flags.
    pub sets: &'a [&'a str],
    /// The `CODEBOX_LOG` filter.
    pub log: &'a str,
    /// Echo its stderr into the test's output as it comes.
    pub echo_stderr: bool,
    /// The HTTP listen address (default `127.0.0.1:0`: a port the OS picks).
    pub listen: Option<&'a str>,
}

impl Default for Options<'_> {
    fn default() -> Self {
        Options {
            http_token: None,
            sets: &[],
            log: "warn",
            echo_stderr: false,
            listen: None,
        }
    }
}

impl ServeChild {
    /// Start it in a fresh data directory; with HTTP, wait until it announces its address.
    pub async fn start(opts: Options<'_>) -> ServeChild {
        ServeChild::start_in(tempfile::tempdir().expect("temp dir"), opts).await
    }

    /// Start it with the given data directory (e.g. one an earlier child used).
    pub async fn start_in(data: tempfile::TempDir, opts: Options<'_>) -> ServeChild {
        ServeChild::start_with_env(data, opts, &[]).await
    }

    /// [`ServeChild::start_in`] with these environment variables set over the defaults (a
    /// private daemon's `DOCKER_HOST` and its `CODEBOX_LANGUAGES`, say).
    pub async fn start_with_env(
        data: tempfile::TempDir,
        opts: Options<'_>,
        env: &[(&str, String)],
    ) -> ServeChild {
        let mut cmd = Command::new(codebox_bin());
        cmd.arg("serve");
        if opts.http_token.is_some() {
            cmd.args([
                "--transport",
                "http",
                "--listen",
                opts.listen.unwrap_or("127.0.0.1:0"),
            ]);
        }
        for s in opts.sets {
            cmd.args(["--set", s]);
        }
        cmd.env("CODEBOX_DATA_DIR", data.path())
            .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
            .env("CODEBOX_LOG", opts.log)
            .env_remove("CODEBOX_CONFIG")
            .env_remove("CODEBOX_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if let Some(token) = opts.http_token {
            cmd.env("CODEBOX_TOKEN", token);
        }
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().expect("spawn codebox serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr piped")).lines();
        let stderr = Arc::new(Mutex::new(StderrLog::default()));
        let mut addr = None;
        if opts.http_token.is_some() {
            addr = Some(loop {
                let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
                    .await
                    .expect("the server announces its address within 120 s")
                    .expect("stderr readable")
                    .expect("the server exited before serving");
                if let Some(rest) = line.strip_prefix("codebox: serving MCP at http://") {
                    break rest.split('/').next().unwrap().to_string();
                }
                record(&stderr, line, opts.echo_stderr);
            });
        }
        // Keep draining stderr so the child never blocks on a full pipe.
        let (log, echo) = (stderr.clone(), opts.echo_stderr);
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                record(&log, line, echo);
            }
        });
        let (stdin, stdout) = (child.stdin.take(), child.stdout.take());
        ServeChild {
            child,
            data: Some(data),
            addr,
            stdin,
            stdout,
            stderr,
        }
    }

    pub fn data_dir(&self) -> &Path {
        self.data.as_ref().expect("the data directory").path()
    }

    /// The data directory, kept for a next start (the child must have exited).
    pub fn into_data(mut self) -> tempfile::TempDir {
        self.data.take().expect("the data directory")
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("the child has not been waited for") as i32
    }

    /// Whether the process still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its instance id: the name of the one lock file in its data directory (waits up to
    /// 60 s for the child to create it).
    pub async fn instance(&self) -> String {
        let dir = self.data_dir().join("instances");
        for _ in 0..600 {
            let ids = instance_locks(&dir);
            match ids.len() {
                0 => tokio::time::sleep(Duration::from_millis(100)).await,
                1 => return ids[0].clone(),
                n => panic!("{n} instance locks in {}", dir.display()),
            }
        }
        panic!("no instance lock in {} after 60 s", dir.display());
    }

    /// Peak resident memory so far (`VmHWM`), in KiB.
    pub fn peak_rss_kb(&self) -> u64 {
        proc_status_kb(self.pid(), "VmHWM:")
    }

    /// Resident memory now (`VmRSS`), in KiB.
    pub fn rss_kb(&self) -> u64 {
        proc_status_kb(self.pid(), "VmRSS:")
    }

    /// Send a signal and wait (up to 90 s) for the exit; returns the exit status.
    pub async fn signal_and_wait(&mut self, signal: i32) -> std::process::ExitStatus {
        // SAFETY: plain kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), signal) };
        self.wait(Duration::from_secs(90)).await
    }

    /// Wait for the exit (it must come within `limit`).
    pub async fn wait(&mut self, limit: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("codebox serve still runs after {limit:?}"))
            .expect("wait for codebox serve")
    }

    /// The panics it reported on stderr, and the last lines it wrote, for assertions.
    pub fn stderr_report(&self) -> (Vec<String>, String) {
        let log = self.stderr.lock().unwrap();
        let tail: Vec<&str> = log.tail.iter().map(String::as_str).collect();
        (log.panics.clone(), tail.join("\n"))
    }

    /// An MCP client over HTTP with this bearer token.
    pub async fn client(&self, token: &str) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
        use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
        use rmcp::transport::StreamableHttpClientTransport;
        use rmcp::ServiceExt;
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(self.http_url("/mcp")).auth_header(token),
        );
        ().serve(t).await.expect("MCP over HTTP")
    }

    pub fn http_url(&self, path: &str) -> String {
        format!(
            "http://{}{path}",
            self.addr.as_deref().expect("an HTTP server")
        )
    }
}

/// How long a dropped child may take to stop after SIGTERM before it is killed.
const DROP_GRACE: Duration = Duration::from_secs(30);

impl Drop for ServeChild {
    fn drop(&mut self) {
        if !self.alive() {
            return;
        }
        // SAFETY: plain kill(2) on our own child's PID. SIGCONT after it: a test that failed
        // while its child was stopped (SIGSTOP) left it unable to act, and its containers
        // behind once it was killed.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
            libc::kill(self.pid(), libc::SIGCONT);
        }
        let deadline = std::time::Instant::now() + DROP_GRACE;
        while std::time::Instant::now() < deadline {
            if !self.alive() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.start_kill();
        // Killed, it left what it held: remove it (a failed test's child was draining runs
        // that go on for long).
        if let Some(data) = &self.data {
            for instance in instance_locks(&data.path().join("instances")) {
                remove_labelled(&format!("label=codebox.instance={instance}"));
            }
        }
    }
}

/// The instance ids of the lock files in `dir`.
fn instance_locks(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".lock"))
                .map(str::to_string)
        })
        .collect()
}

/// Force-remove the containers, then the volumes, matching a `docker` label filter.
fn remove_labelled(filter: &str) {
    for (list, remove) in [
        (&["ps", "-aq"][..], &["rm", "-f"][..]),
        (&["volume", "ls", "-q"][..], &["volume", "rm"][..]),
    ] {
        let Ok(out) = std::process::Command::new("docker")
            .args(list)
            .args(["--filter", filter])
            .output()
        else {
            return;
        };
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        if !ids.is_empty() {
            let _ = std::process::Command::new("docker")
                .args(remove)
                .args(&ids)
                .output();
        }
    }
}

fn record(log: &Mutex<StderrLog>, line: String, echo: bool) {
    if echo {
        eprintln!("[codebox serve] {line}");
    }
    let mut log = log.lock().unwrap();
    log.lines += 1;
    if line.contains("panicked") {
        log.panics.push(line.clone());
    }
    if log.tail.len() == STDERR_TAIL {
        log.tail.pop_front();
    }
    log.tail.push_back(line);
}

fn proc_status_kb(pid: i32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// Containers and volumes of a codebox instance that still exist.
pub fn instance_objects(instance: &str) -> Vec<String> {
    crate::common::labelled_objects(&format!("label=codebox.instance={instance}"))
}
