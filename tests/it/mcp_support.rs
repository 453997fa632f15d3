//! Shared fixtures for the MCP server tests: run managers on the fake engine or on Docker,
//! an in-process rmcp client over `tokio::io::duplex`, and tool-call helpers (the real
//! binary as a child: `serve_child`).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use codebox::config::Config;
use codebox::engine::fake::FakeEngine;
use codebox::engine::ContainerEngine;
use codebox::executor::Executor;
use codebox::history::{History, Owner};
use codebox::mcp::CodeboxServer;
use codebox::runs::RunManager;
use rmcp::handler::client::ClientHandler;
use rmcp::model::{CallToolRequestParams, CallToolResult, ProgressNotificationParam};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{RoleClient, ServiceExt};
use serde_json::Value;

use codebox::sessions::Sessions;

use crate::common::{instance, registry};

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
        Arc::new(crate::common::docker_engine().expect("docker client")),
        |c| {
            c.sandbox.runtime = crate::common::test_runtime();
            tweak(c)
        },
        history,
    )
}

/// The sessions of a manager on the fake engine (and through them, its runs).
pub fn fake_sessions(fake: &Arc<FakeEngine>, tweak: impl FnOnce(&mut Config)) -> Arc<Sessions> {
    Sessions::new(fake_manager(fake, tweak))
}

/// The sessions of a manager on Docker.
pub fn docker_sessions(tweak: impl FnOnce(&mut Config), history: Option<History>) -> Arc<Sessions> {
    Sessions::new(docker_manager(tweak, history))
}

/// A history database in a fresh temporary folder (kept alive by the returned guard).
pub fn temp_history() -> (History, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let h = History::open(
        &dir.path().join("history.sqlite3"),
        Owner {
            instance: instance().to_string(),
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
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
    let server = CodeboxServer::new(Sessions::new(manager));
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

/// The bearer token of the test servers that serve HTTP.
pub const TOKEN: &str = "serve-test-token-0123456789";
