//! Shared fixtures for the MCP server tests: run managers on the fake engine or on Docker,
//! an in-process rmcp client over `tokio::io::duplex`, tool-call helpers, and the real
//! binary serving HTTP.

#![allow(dead_code)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use codebox::config::Config;
use codebox::engine::docker::DockerEngine;
use codebox::engine::fake::FakeEngine;
use codebox::engine::ContainerEngine;
use codebox::executor::Executor;
use codebox::history::{History, Owner};
use codebox::mcp::CodeboxServer;
use codebox::runs::RunManager;
use rmcp::handler::client::ClientHandler;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::common::{codebox_bin, instance, registry};

/// A manager on any engine; `tweak` edits the config (not validated, so tests may use
/// values operators cannot, like a one-second retention).
pub fn manager_on(
    engine: Arc<dyn ContainerEngine>,
    tweak: impl FnOnce(&mut Config),
    history: Option<History>,
) -> RunManager {
    let mut config = Config::default();
    tweak(&mut config);
    let config = Arc::new(config);
    let executor = Arc::new(Executor::new(
        engine,
        config.clone(),
        instance().to_string(),
    ));
    RunManager::new(executor, registry(), config, history)
}

pub fn fake_manager(fake: &Arc<FakeEngine>, tweak: impl FnOnce(&mut Config)) -> RunManager {
    manager_on(fake.clone(), tweak, None)
}

pub fn docker_manager(tweak: impl FnOnce(&mut Config), history: Option<History>) -> RunManager {
    manager_on(
        Arc::new(DockerEngine::connect().expect("docker client")),
        |c| {
            c.sandbox.runtime = crate::common::test_runtime();
            tweak(c)
        },
        history,
    )
}

/// A history database in a fresh temporary folder (kept alive by the returned guard).
pub fn temp_history() -> (History, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(
        &dir.path().join("history.sqlite3"),
        Owner {
            instance: instance().to_string(),
            data_dir: dir.path().to_path_buf(),
        },
    );
    (h, dir)
}

/// A client that records progress notifications.
#[derive(Clone, Default)]
pub struct Client {
    pub progress: Arc<Mutex<Vec<ProgressNotificationParam>>>,
}

impl ClientHandler for Client {
    async fn on_progress(
        &self,
        p: ProgressNotificationParam,
        _cx: NotificationContext<RoleClient>,
    ) {
        self.progress.lock().unwrap().push(p);
    }
}

pub type Session = RunningService<RoleClient, Client>;

/// Serve `manager`'s tools in-process and connect a client over a duplex pipe.
pub async fn connect(manager: RunManager) -> Session {
    let (server_io, client_io) = tokio::io::duplex(1 << 20);
    let server = CodeboxServer::new(manager);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    Client::default()
        .serve(client_io)
        .await
        .expect("client connects")
}

pub fn params(name: &'static str, args: Value) -> CallToolRequestParams {
    let args = args.as_object().cloned().expect("arguments are an object");
    CallToolRequestParams::new(name).with_arguments(args)
}

/// Call a tool; protocol errors fail the test.
pub async fn call(client: &Session, name: &'static str, args: Value) -> CallToolResult {
    client
        .call_tool(params(name, args))
        .await
        .unwrap_or_else(|e| panic!("{name}: protocol error {e}"))
}

/// Call a tool that must succeed; returns its structured content.
pub async fn ok(client: &Session, name: &'static str, args: Value) -> Value {
    let res = call(client, name, args.clone()).await;
    assert_ne!(
        res.is_error,
        Some(true),
        "{name}({args}) failed: {}",
        text(&res)
    );
    res.structured_content
        .clone()
        .unwrap_or_else(|| panic!("{name}: no structured content"))
}

/// Call a tool that must fail as a tool error; returns its text.
pub async fn tool_error(client: &Session, name: &'static str, args: Value) -> String {
    let res = call(client, name, args.clone()).await;
    assert_eq!(
        res.is_error,
        Some(true),
        "{name}({args}) should fail: {res:?}"
    );
    text(&res)
}

pub fn text(res: &CallToolResult) -> String {
    res.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait until every container the manager's executor created is removed (removal follows
/// the report, in the background of this test's runtime).
pub async fn settle(m: &RunManager) {
    assert!(
        m.executor().cleanup().drain(Duration::from_secs(30)).await,
        "containers still being removed after 30 s"
    );
}

/// Poll until `check` holds (at most `secs` seconds).
pub async fn eventually(secs: u64, what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..secs * 20 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting until {what}");
}

/// Docker objects labelled `codebox.run=<id>`; empty when the run cleaned up.
pub fn labelled(run_id: &str) -> Vec<String> {
    crate::common::leftovers(run_id)
}

/// The bearer token of [`Server`]s.
pub const TOKEN: &str = "serve-test-token-0123456789";

/// A `codebox serve --transport http` child on a free port, logging to the test's stderr;
/// killed by PID when dropped.
pub struct Server {
    child: Child,
    pub addr: String,
}

impl Server {
    /// Start one with this data directory and these extra variables (settings).
    pub async fn start(data_dir: &std::path::Path, envs: &[(&str, &str)]) -> Server {
        Server::start_named("codebox serve", data_dir, envs).await
    }

    /// The same, its log lines prefixed with `[name]`.
    pub async fn start_named(
        name: &str,
        data_dir: &std::path::Path,
        envs: &[(&str, &str)],
    ) -> Server {
        let mut child = Command::new(codebox_bin())
            .args(["serve", "--transport", "http", "--listen", "127.0.0.1:0"])
            .env("CODEBOX_DATA_DIR", data_dir)
            .env("CODEBOX_TOKEN", TOKEN)
            .env("CODEBOX_LOG", "info,bollard=warn")
            .env_remove("CODEBOX_CONFIG")
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn codebox serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .expect("server announces its address")
                .unwrap()
                .expect("server exited before serving");
            eprintln!("[{name}] {line}");
            if let Some(rest) = line.strip_prefix("codebox: serving MCP at http://") {
                break rest.split('/').next().unwrap().to_string();
            }
        };
        // Keep draining stderr so the child never blocks on a full pipe.
        let name = name.to_string();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                eprintln!("[{name}] {line}");
            }
        });
        Server { child, addr }
    }

    pub fn pid(&self) -> i32 {
        self.child.id().expect("running") as i32
    }

    /// Send `signal` and wait (up to 60 s) for the process to end.
    pub async fn kill(mut self, signal: i32) {
        // SAFETY: plain kill(2) on our own child's PID.
        unsafe { libc::kill(self.pid(), signal) };
        let _ = tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await;
    }

    /// An MCP client over HTTP with the token.
    pub async fn client(&self) -> rmcp::service::RunningService<rmcp::RoleClient, ()> {
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("http://{}/mcp", self.addr))
                .auth_header(TOKEN),
        );
        ().serve(t).await.expect("MCP over HTTP")
    }
}
