//! The harness of the cluster tests (SPEC section 15): real `codebox serve` processes over
//! HTTP, one throwaway PostgreSQL history, the cluster secret. Each server has a data
//! directory of its own, as separate hosts would, so each judges the others by their leases.
//! Tests that check where a run's containers were made give each server a Docker host of its
//! own ([`private_hosts`]: a private daemon in network and mount namespaces of its own, with
//! the images base, bash and lua) and read each daemon's event log through [`Watch`]; the
//! others share the machine's daemon. [`Nginx`] puts a balancer in front of the servers.
//!
//! The guarantees are in files of their own: `cluster_settings.rs`, `cluster_any_server.rs`,
//! `cluster_lease.rs`, `cluster_drain.rs`, `cluster_nginx.rs`, `cluster_outage.rs`,
//! `cluster_queue.rs`, `cluster_busy.rs`, `cluster_partition.rs`.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::CallToolResult;
use rmcp::service::RunningService;
use rmcp::RoleClient;
use serde_json::{json, Value};

use crate::common::{free_port, labelled_objects};
use crate::mcp_support::{eventually, params, text, TOKEN};
use crate::pg_cluster::PgCluster;
pub(crate) use crate::private_daemon::private_hosts;
use crate::private_daemon::{watch_creations, Creations, OwnedDaemon, PrivateDaemon};
use crate::serve_child::{Options, ServeChild};

pub(crate) type Client = RunningService<RoleClient, ()>;

pub(crate) const SECRET: &str = "cluster-test-secret-0123456789abcdef";

pub(crate) async fn call(client: &Client, tool: &'static str, args: Value) -> CallToolResult {
    client
        .call_tool(params(tool, args))
        .await
        .unwrap_or_else(|e| panic!("{tool}: protocol error {e}"))
}

pub(crate) async fn ok(client: &Client, tool: &'static str, args: Value) -> Value {
    let res = call(client, tool, args.clone()).await;
    assert_ne!(res.is_error, Some(true), "{tool}({args}): {}", text(&res));
    res.structured_content.expect("structured content")
}

pub(crate) async fn tool_error(client: &Client, tool: &'static str, args: Value) -> String {
    let res = call(client, tool, args.clone()).await;
    assert_eq!(
        res.is_error,
        Some(true),
        "{tool}({args}) should fail: {res:?}"
    );
    text(&res)
}

/// One server of the cluster, in `dir`, with the secret at `secret` and `extra` settings: on
/// the machine's Docker daemon, or on a private daemon of its own when `host` is given (its
/// socket, and the registry of the languages its images hold; no ready sessions, whose
/// Python it lacks).
pub(crate) async fn node_on(
    dir: tempfile::TempDir,
    history_url: &str,
    secret: &Path,
    extra: &[&str],
    host: Option<&PrivateDaemon>,
) -> ServeChild {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut sets = vec![
        format!("history.url={history_url}"),
        format!("cluster.advertise_url=http://{listen}"),
        format!("cluster.secret_file={}", secret.display()),
        "pool.sizes={}".to_string(),
    ];
    let mut env = Vec::new();
    if let Some(host) = host {
        sets.push("sessions.ready={}".to_string());
        env.push(("DOCKER_HOST", host.socket()));
        env.push(("CODEBOX_LANGUAGES", host.registry.display().to_string()));
    }
    sets.extend(extra.iter().map(|s| s.to_string()));
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    ServeChild::start_with_env(
        dir,
        Options {
            http_token: Some(TOKEN),
            sets: &sets,
            log: "info,bollard=warn",
            echo_stderr: true,
            listen: Some(&listen),
        },
        &env,
    )
    .await
}

/// A cluster for one test: a throwaway PostgreSQL with one database, the secret, and one
/// server for each entry of `settings` (its own data directory and those settings), started
/// at once.
pub(crate) struct TestCluster {
    pub(crate) pg: PgCluster,
    pub(crate) url: String,
    pub(crate) secret: std::path::PathBuf,
    /// The folder of the secret file, kept while the cluster lives.
    _keys: tempfile::TempDir,
    pub(crate) nodes: Vec<ServeChild>,
}

pub(crate) async fn start_cluster(db: &str, settings: &[&[&str]]) -> TestCluster {
    start_cluster_on(db, settings, &[]).await
}

/// [`start_cluster`] with server `i` on `hosts[i]` (none: the machine's daemon for all).
pub(crate) async fn start_cluster_on(
    db: &str,
    settings: &[&[&str]],
    hosts: &[OwnedDaemon],
) -> TestCluster {
    assert!(hosts.is_empty() || hosts.len() >= settings.len());
    let pg = PgCluster::start();
    let url = pg.create_database(db);
    let keys = tempfile::tempdir().unwrap();
    let secret = secret_file(keys.path());
    let starts = settings.iter().enumerate().map(|(i, extra)| {
        let host = hosts.get(i).map(|h| &**h);
        node_on(tempfile::tempdir().unwrap(), &url, &secret, extra, host)
    });
    let nodes = futures_util::future::join_all(starts).await;
    TestCluster {
        pg,
        url,
        secret,
        _keys: keys,
        nodes,
    }
}

/// The servers of a cluster of `N`, by name.
pub(crate) fn servers<const N: usize>(nodes: Vec<ServeChild>) -> [ServeChild; N] {
    nodes
        .try_into()
        .unwrap_or_else(|_| panic!("a cluster of {N}"))
}

impl TestCluster {
    /// The servers of a cluster of `N`, by name; the database and the secret stay here.
    pub(crate) fn servers<const N: usize>(&mut self) -> [ServeChild; N] {
        servers(std::mem::take(&mut self.nodes))
    }

    /// A server again on the data directory of `gone` (killed), on `host`, with `extra`.
    pub(crate) async fn restart_on(
        &self,
        gone: ServeChild,
        extra: &[&str],
        host: &PrivateDaemon,
    ) -> ServeChild {
        node_on(gone.into_data(), &self.url, &self.secret, extra, Some(host)).await
    }
}

pub(crate) fn secret_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("cluster.secret");
    std::fs::write(&path, format!("{SECRET}\n")).unwrap();
    path
}

/// Wait until `client`'s server finds `run_id` in the shared history (its own server
/// records it a moment after answering).
pub(crate) async fn known(client: &Client, run_id: &str) {
    for _ in 0..200 {
        let rows = ok(client, "get_execution_history", json!({"limit": 50})).await;
        if rows["runs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["run_id"] == run_id)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("run {run_id} never reached the shared history");
}

pub(crate) async fn start(client: &Client, code: &str) -> String {
    start_lang(client, "python", code).await
}

pub(crate) async fn start_lang(client: &Client, language: &str, code: &str) -> String {
    start_args(client, json!({"language": language, "code": code})).await
}

/// `start_run` with these arguments; the run's id.
pub(crate) async fn start_args(client: &Client, args: Value) -> String {
    ok(client, "start_run", args).await["run_id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Containers and volumes matching a label filter on any of `hosts`.
pub(crate) fn on_hosts(hosts: &[OwnedDaemon], filter: &str) -> Vec<String> {
    hosts.iter().flat_map(|h| h.labelled(filter)).collect()
}

/// What a run left on any of `hosts`.
pub(crate) fn left_on_hosts(hosts: &[OwnedDaemon], run_id: &str) -> Vec<String> {
    on_hosts(hosts, &format!("label=codebox.run={run_id}"))
}

/// The container creations of the private hosts and of the machine's daemon, from now on.
pub(crate) struct Watch {
    hosts: Vec<Creations>,
    machine: Creations,
}

pub(crate) fn watch(hosts: &[OwnedDaemon]) -> Watch {
    Watch {
        hosts: hosts.iter().map(|h| h.watch_creations()).collect(),
        machine: watch_creations(&[]),
    }
}

impl Watch {
    /// Which host made each run's containers: `instances[k]` is the server on host `k`.
    /// Asserts that each daemon made containers for its own server only, that each run's
    /// containers came from one daemon, that every run of `ids` made some, and that the
    /// machine's own daemon made none for these servers.
    pub(crate) fn hosts_of(
        &self,
        instances: &[String],
        ids: &[String],
    ) -> std::collections::BTreeMap<String, usize> {
        let mut made_on = std::collections::BTreeMap::new();
        for (k, host) in self.hosts.iter().enumerate().take(instances.len()) {
            for (run, instance) in host.so_far() {
                assert_eq!(
                    instance, instances[k],
                    "host {k} made a container (run {run}) for another server"
                );
                if run.is_empty() {
                    continue;
                }
                let first = *made_on.entry(run.clone()).or_insert(k);
                assert_eq!(first, k, "run {run}: containers on hosts {first} and {k}");
            }
        }
        for id in ids {
            assert!(
                made_on.contains_key(id),
                "run {id}: no daemon made its containers"
            );
        }
        let machine: Vec<(String, String)> = self
            .machine
            .so_far()
            .into_iter()
            .filter(|(_, instance)| instances.contains(instance))
            .collect();
        assert!(
            machine.is_empty(),
            "the machine's daemon made containers for the private hosts' servers: {machine:?}"
        );
        made_on
    }
}

/// Debian's nginx in front of the servers (`scripts/ensure-nginx.sh` installs it), with a
/// config of its own on a loopback port: round robin, keepalive to the servers, no
/// buffering and long timeouts so that long polls (`wait_seconds`) and streams pass whole.
/// Stopped (by its PID) when dropped.
pub(crate) struct Nginx {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

const NGINX: &str = "/usr/sbin/nginx";

impl Nginx {
    pub(crate) fn start(upstreams: &[String]) -> Nginx {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let d = dir.path().display();
        let servers: String = upstreams
            .iter()
            .map(|u| format!("        server {u} max_fails=0;\n"))
            .collect();
        // SAFETY: geteuid has no preconditions.
        let user = if unsafe { libc::geteuid() } == 0 {
            "user root;\n"
        } else {
            ""
        };
        let conf = format!(
            "{user}worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream codebox {{
{servers}        keepalive 32;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 32m;
        location / {{
            proxy_pass http://codebox;
            proxy_http_version 1.1;
            proxy_set_header Connection \"\";
            proxy_set_header Host $host;
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 3600s;
            proxy_send_timeout 3600s;
        }}
    }}
}}
"
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let child = std::process::Command::new(NGINX)
            .args(["-p", &d.to_string(), "-c", &path.display().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("nginx (scripts/ensure-nginx.sh installs it)");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Nginx {
                    child,
                    port,
                    _dir: dir,
                };
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let mut child = child;
        // SAFETY: a signal to the nginx this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let _ = child.wait();
        panic!(
            "nginx did not listen on {port}: {}",
            std::fs::read_to_string(dir.path().join("error.log")).unwrap_or_default()
        );
    }

    /// Nginx in front of `nodes`.
    pub(crate) fn in_front_of(nodes: &[ServeChild]) -> Nginx {
        let upstreams: Vec<String> = nodes.iter().map(|n| n.addr.clone().unwrap()).collect();
        Nginx::start(&upstreams)
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SAFETY: a signal to the nginx master this test started; it stops its worker.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// The cluster's history, read through nginx once every server has written what it answered
/// (each server's history thread writes a run's end a moment after its answer: asking each
/// once is a barrier).
pub(crate) async fn history_through(
    http: &reqwest::Client,
    nodes: &[ServeChild],
    nginx: &Nginx,
) -> Value {
    for n in nodes {
        http.get(n.http_url("/v1/history?limit=1"))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
    }
    http.get(nginx.url("/v1/history?limit=1000"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// `run_id`'s final report through `client`, however long it waits (each call waits 60 s).
pub(crate) async fn final_report(client: &Client, run_id: &str) -> Value {
    for _ in 0..10 {
        let r = ok(
            client,
            "get_result",
            json!({"run_id": run_id, "wait_seconds": 60}),
        )
        .await;
        if !matches!(r["status"].as_str(), Some("queued" | "running")) {
            return r;
        }
    }
    panic!("run {run_id} never ended");
}

/// Which server ran each run, from the shared history (each run exactly one row).
pub(crate) async fn ran_on(client: &Client, ids: &[String]) -> Vec<(String, String)> {
    let rows = ok(client, "get_execution_history", json!({"limit": 1000})).await;
    let rows = rows["runs"].as_array().unwrap();
    ids.iter()
        .map(|id| {
            let mine: Vec<&Value> = rows.iter().filter(|r| r["run_id"] == id.as_str()).collect();
            assert_eq!(mine.len(), 1, "run {id}: one history row");
            (
                mine[0]["instance"].as_str().unwrap().to_string(),
                mine[0]["status"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The `instance` of each server, in order.
pub(crate) async fn instances(nodes: &[ServeChild]) -> Vec<String> {
    let mut names = Vec::new();
    for n in nodes {
        names.push(n.instance().await);
    }
    names
}

/// Stop each server with SIGTERM and wait for it.
pub(crate) async fn stop_all<'a>(nodes: impl IntoIterator<Item = &'a mut ServeChild>) {
    for n in nodes {
        n.signal_and_wait(libc::SIGTERM).await;
    }
}

/// A session of `language` opened through `client`; its id.
pub(crate) async fn open_session(client: &Client, language: &str) -> String {
    ok(client, "create_session", json!({"language": language})).await["session_id"]
        .as_str()
        .expect("a session")
        .to_string()
}

/// `POST url` with the token and a JSON body; the answer's JSON.
pub(crate) async fn post_json(http: &reqwest::Client, url: &str, body: Value) -> Value {
    let res = http.post(url).bearer_auth(TOKEN).json(&body).send().await;
    res.unwrap().json().await.unwrap()
}

/// `GET url` with the token; the answer's JSON.
pub(crate) async fn get_json(http: &reqwest::Client, url: &str) -> Value {
    let res = http.get(url).bearer_auth(TOKEN).send().await;
    res.unwrap().json().await.unwrap()
}

/// `DELETE url` with the token; the answer's JSON.
pub(crate) async fn delete_json(http: &reqwest::Client, url: &str) -> Value {
    let res = http.delete(url).bearer_auth(TOKEN).send().await;
    res.unwrap().json().await.unwrap()
}

/// `get_result` of `run_id` through `client` until the run is `sandbox_error` (for 30 s at
/// most); each tool error on the way goes to `on_error`. The last report read.
pub(crate) async fn until_sandbox_error(
    client: &Client,
    run_id: &str,
    mut on_error: impl FnMut(String),
) -> Value {
    let mut last = Value::Null;
    for _ in 0..300 {
        let res = call(client, "get_result", json!({"run_id": run_id})).await;
        if res.is_error == Some(true) {
            on_error(text(&res));
        } else {
            last = res.structured_content.expect("structured content");
            if last["status"] == "sandbox_error" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    last
}

/// Wait until `host` holds containers of `run_id`.
pub(crate) async fn running_on(host: &PrivateDaemon, run_id: &str, what: &str) {
    let filter = format!("label=codebox.run={run_id}");
    eventually(60, what, || !host.labelled(&filter).is_empty()).await;
}

/// A server killed outright (`instance`, on `hosts[k]`) left its containers there, on no
/// other host and not on the machine's daemon.
pub(crate) fn left_only_on(hosts: &[OwnedDaemon], k: usize, instance: &str) {
    let filter = format!("label=codebox.instance={instance}");
    assert!(!hosts[k].labelled(&filter).is_empty());
    for (j, host) in hosts.iter().enumerate().filter(|(j, _)| *j != k) {
        assert!(
            host.labelled(&filter).is_empty(),
            "{instance} left some on host {j}"
        );
    }
    assert!(
        labelled_objects(&filter).is_empty(),
        "none on the machine's daemon"
    );
}

/// Wait until `host` holds nothing of `instance` (a server on its data directory reaps it).
pub(crate) async fn reaped(host: &PrivateDaemon, instance: &str) {
    let filter = format!("label=codebox.instance={instance}");
    eventually(60, "the killed server's containers are removed", || {
        host.labelled(&filter).is_empty()
    })
    .await;
}
