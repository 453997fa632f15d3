//! Several servers as one (SPEC section 15): real `codebox serve` processes over HTTP, one
//! throwaway PostgreSQL history, the cluster secret. Each server has a data directory of its
//! own, as separate hosts would, so each judges the others by their leases. The tests the
//! issue names (300 runs through nginx, a server killed mid-load, a server killed with a
//! session) give each server a Docker host of its own: a private daemon in network and mount
//! namespaces of its own ([`private_hosts`], images base, bash and lua), and check on each
//! daemon's event log that a run's containers were made on its server's daemon and no other;
//! the others share the machine's daemon.
//! - servers that share a history without `cluster.advertise_url` / `cluster.secret_file`
//!   refuse to start, naming what is missing;
//! - a call about a run or a session another server holds is forwarded to it, over MCP and
//!   over `/v1`, and the client sees the owner's answer (not a 409 naming it);
//! - a server killed outright: within its lease the others mark its running run
//!   `sandbox_error` ("its server stopped answering") and end its session ("the server that
//!   held it stopped"); its containers go when its data directory next gets a server.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolResult, ClientRequest, Request};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::RoleClient;
use serde_json::{json, Value};

use crate::common::{codebox_bin, labelled_objects, leftovers, root};
use crate::mcp_support::{eventually, params, text, TOKEN};
use crate::pg_cluster::PgCluster;
use crate::private_daemon::{
    private_hosts, watch_creations, Creations, OwnedDaemon, PrivateDaemon,
};
use crate::serve_child::{Options, ServeChild};

pub(crate) type Client = RunningService<RoleClient, ()>;

const SECRET: &str = "cluster-test-secret-0123456789abcdef";

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

/// A port nobody listens on now (the OS's pick), for a server's advertise_url.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One server of the cluster, in `dir`, with the secret at `secret` and `extra` settings: on
/// the machine's Docker daemon, or on a private daemon of its own when `host` is given (its
/// socket, and the registry of the languages its images hold; no ready sessions, whose
/// Python it lacks).
async fn node_on(
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
    pub(crate) keys: tempfile::TempDir,
    pub(crate) nodes: Vec<ServeChild>,
}

pub(crate) async fn start_cluster(db: &str, settings: &[&[&str]]) -> TestCluster {
    start_cluster_on(db, settings, &[]).await
}

/// [`start_cluster`] with server `i` on `hosts[i]` (none: the machine's daemon for all).
async fn start_cluster_on(db: &str, settings: &[&[&str]], hosts: &[OwnedDaemon]) -> TestCluster {
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
        keys,
        nodes,
    }
}

/// The servers of a cluster of `N`, by name.
pub(crate) fn servers<const N: usize>(nodes: Vec<ServeChild>) -> [ServeChild; N] {
    nodes
        .try_into()
        .unwrap_or_else(|_| panic!("a cluster of {N}"))
}

fn secret_file(dir: &Path) -> std::path::PathBuf {
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

async fn start_lang(client: &Client, language: &str, code: &str) -> String {
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
fn on_hosts(hosts: &[OwnedDaemon], filter: &str) -> Vec<String> {
    hosts.iter().flat_map(|h| h.labelled(filter)).collect()
}

/// What a run left on any of `hosts`.
fn left_on_hosts(hosts: &[OwnedDaemon], run_id: &str) -> Vec<String> {
    on_hosts(hosts, &format!("label=codebox.run={run_id}"))
}

/// The container creations of the private hosts and of the machine's daemon, from now on.
struct Watch {
    hosts: Vec<Creations>,
    machine: Creations,
}

fn watch(hosts: &[OwnedDaemon]) -> Watch {
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
    fn hosts_of(
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_history_over_http_without_the_cluster_settings_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let short = dir.path().join("short.secret");
    std::fs::write(&short, "too short\n").unwrap();
    let good = secret_file(dir.path());
    // No database is reached: the refusal comes first.
    let history = "history.url=postgres://codebox@127.0.0.1:9/none";
    let advertise = "cluster.advertise_url=http://127.0.0.1:9";
    let short_set = format!("cluster.secret_file={}", short.display());
    let good_set = format!("cluster.secret_file={}", good.display());
    for (sets, expected) in [
        (
            vec![history],
            "needs cluster.advertise_url and cluster.secret_file",
        ),
        (vec![history, advertise], "needs cluster.secret_file"),
        (
            vec![history, good_set.as_str()],
            "needs cluster.advertise_url",
        ),
        (
            vec![history, advertise, short_set.as_str()],
            "at least 16 characters",
        ),
        (
            vec![
                history,
                "cluster.advertise_url=http://127.0.0.1:0",
                good_set.as_str(),
            ],
            "cluster.advertise_url",
        ),
    ] {
        let mut cmd = std::process::Command::new(codebox_bin());
        cmd.args(["serve", "--transport", "http", "--listen", "127.0.0.1:0"]);
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = cmd
            .env("CODEBOX_DATA_DIR", dir.path())
            .env("CODEBOX_LANGUAGES", root().join("languages.toml"))
            .env("CODEBOX_TOKEN", TOKEN)
            .env("CODEBOX_LOG", "error")
            .env_remove("CODEBOX_CONFIG")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sets:?} started: {stderr}");
        assert!(stderr.contains(expected), "{sets:?}: {stderr}");
        assert!(!stderr.contains("serving MCP"), "{sets:?}: {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_server_answers_for_the_runs_and_sessions_another_holds() {
    let t0 = Instant::now();
    let TestCluster {
        pg: _pg,
        keys: _keys,
        nodes,
        ..
    } = start_cluster("forward", &[&[], &[]]).await;
    let [mut a, mut b] = servers(nodes);
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    let http = reqwest::Client::new();
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // get_result on B of a run A holds: A's own report, as it stands, then at its end.
    // Long enough to be unfinished when B asks, however loaded the machine.
    let slow = start(&ca, "import time\ntime.sleep(6)\nprint('slow')").await;
    known(&cb, &slow).await;
    let now = ok(&cb, "get_result", json!({"run_id": slow})).await;
    assert!(
        matches!(now["status"].as_str(), Some("queued" | "running")),
        "{now}"
    );
    let done = ok(
        &cb,
        "get_result",
        json!({"run_id": slow, "wait_seconds": 30}),
    )
    .await;
    assert_eq!(
        (done["status"].as_str(), done["stdout"].as_str()),
        (Some("succeeded"), Some("slow\n")),
        "{done}"
    );

    // stop_run on B stops A's run (its containers are gone when it answers, on A).
    let long = start(&ca, "import time\ntime.sleep(600)").await;
    known(&cb, &long).await;
    eventually(60, "the long run's containers exist", || {
        !leftovers(&long).is_empty()
    })
    .await;
    let stopped = ok(&cb, "stop_run", json!({"run_id": long})).await;
    assert_eq!(stopped["status"], "stopped", "{stopped}");
    eventually(30, "the stopped run's containers are removed", || {
        leftovers(&long).is_empty()
    })
    .await;

    // A session opened on A, used through B over MCP: executions, a file, the close.
    let info = ok(&ca, "create_session", json!({"language": "python"})).await;
    let sid = info["session_id"].as_str().unwrap().to_string();
    let r = ok(
        &cb,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "x = 41\nopen('f.txt', 'w').write('hi')"}),
    )
    .await;
    assert_eq!(r["status"], "succeeded", "{r}");
    let r = ok(
        &ca,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(x + 1)"}),
    )
    .await;
    assert_eq!(r["stdout"], "42\n", "the state made through B is A's: {r}");
    let f = ok(
        &cb,
        "read_session_file",
        json!({"session_id": sid, "path": "f.txt"}),
    )
    .await;
    assert_eq!(f["size_bytes"], 2, "{f}");
    // A step of the session on its own server, and forwarded from the other (for
    // docs/PERFORMANCE.md; printed, not asserted).
    const STEPS: usize = 15;
    let (mut direct, mut forwarded) = (Vec::new(), Vec::new());
    for _ in 0..STEPS {
        for (client, times) in [(&ca, &mut direct), (&cb, &mut forwarded)] {
            let t = Instant::now();
            let r = ok(
                client,
                "run_code",
                json!({"language": "python", "session_id": sid, "code": "pass"}),
            )
            .await;
            times.push(t.elapsed());
            assert_eq!(r["status"], "succeeded", "{r}");
        }
    }
    direct.sort();
    forwarded.sort();
    let median = |v: &[Duration]| v[v.len() / 2].as_secs_f64() * 1e3;
    eprintln!(
        "a session step over MCP: direct median {:.1} ms, forwarded median {:.1} ms ({STEPS} each)",
        median(&direct),
        median(&forwarded)
    );
    // Cancelling a run_code that B forwarded stops the execution on A.
    let request = ClientRequest::CallToolRequest(Request::new(params(
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "import time\ntime.sleep(25)"}),
    )));
    let handle = cb
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
        .unwrap();
    let mut cancelled = None;
    for _ in 0..400 {
        let rows = ok(
            &cb,
            "get_execution_history",
            json!({"session_id": sid, "status": "running"}),
        )
        .await;
        if let Some(r) = rows["runs"].as_array().unwrap().first() {
            cancelled = Some(r["run_id"].as_str().unwrap().to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let cancelled = cancelled.expect("the forwarded execution runs on A");
    handle
        .cancel(Some("user pressed stop".into()))
        .await
        .unwrap();
    let r = ok(
        &ca,
        "get_result",
        json!({"run_id": cancelled, "wait_seconds": 20}),
    )
    .await;
    assert_eq!(r["status"], "stopped", "{r}");
    let listed = ok(&cb, "list_sessions", json!({})).await;
    assert_eq!(
        listed["sessions"],
        json!([]),
        "B lists only its own: {listed}"
    );
    let closed = ok(&cb, "close_session", json!({"session_id": sid})).await;
    assert_eq!(
        (closed["closed"].as_bool(), closed["executions"].as_u64()),
        (Some(true), Some(3 + 2 * STEPS as u64)),
        "{closed}"
    );
    let ended = tool_error(
        &ca,
        "run_code",
        json!({"language": "python", "session_id": sid, "code": "print(x)"}),
    )
    .await;
    assert!(ended.contains("closed"), "{ended}");

    // The same over /v1: open on B, execute and read on A, close on A.
    let v1 = |node: &ServeChild, path: &str| node.http_url(path);
    let created: Value = http
        .post(v1(&b, "/v1/sessions"))
        .bearer_auth(TOKEN)
        .json(&json!({"language": "python"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid2 = created["session_id"]
        .as_str()
        .expect("a session")
        .to_string();
    let run: Value = http
        .post(v1(&a, "/v1/runs"))
        .bearer_auth(TOKEN)
        .json(&json!({"language": "python", "session_id": sid2, "code": "open('g.txt', 'w').write('abc')\nprint('in b')"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (run["status"].as_str(), run["stdout"].as_str()),
        (Some("succeeded"), Some("in b\n")),
        "{run}"
    );
    let file = http
        .get(v1(&a, &format!("/v1/sessions/{sid2}/files/g.txt")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(file.status(), 200);
    let file: Value = file.json().await.unwrap();
    assert_eq!(file["content_base64"], "YWJj", "{file}");
    let closed = http
        .delete(v1(&a, &format!("/v1/sessions/{sid2}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(closed.status(), 200);
    let closed: Value = closed.json().await.unwrap();
    assert_eq!(closed["closed"], true, "{closed}");

    // GET /v1/runs/{id} on B, waiting, for a run accepted by A.
    let accepted: Value = http
        .post(v1(&a, "/v1/runs"))
        .bearer_auth(TOKEN)
        .json(&json!({"language": "python", "code": "import time\ntime.sleep(1)\nprint('v1')", "wait": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = accepted["run_id"].as_str().unwrap().to_string();
    known(&cb, &id).await;
    let got: Value = http
        .get(v1(&b, &format!("/v1/runs/{id}?wait_seconds=30")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (got["status"].as_str(), got["stdout"].as_str()),
        (Some("succeeded"), Some("v1\n")),
        "{got}"
    );

    // The servers' own route takes only the cluster secret; a wrong one is no token either.
    let forwarded = http
        .post(v1(&a, "/cluster/tools/get_result"))
        .bearer_auth(TOKEN)
        .json(&json!({"run_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(forwarded.status(), 401);
    let wrong = http
        .get(v1(&a, &format!("/v1/runs/{id}")))
        .header("x-codebox-cluster", "not-the-secret-0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let right: Value = http
        .post(v1(&a, "/cluster/tools/get_result"))
        .header("x-codebox-cluster", SECRET)
        .json(&json!({"run_id": id}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(right["structuredContent"]["status"], "succeeded", "{right}");

    // Capacity, for a balancer.
    let health: Value = http
        .get(v1(&a, "/healthz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(health["capacity"]["slots"], 4, "{health}");
    assert!(health["capacity"]["memory_budget_mb"].as_u64().unwrap() > 0);

    drop((ca, cb));
    a.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
    for run in [&slow, &long, &id] {
        assert!(leftovers(run).is_empty(), "run {run} left containers");
    }
    eprintln!("whole test {:.1} s", t0.elapsed().as_secs_f64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_loses_its_runs_and_sessions_within_its_lease() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let lease: &[&str] = &["cluster.lease_seconds=3"];
    let TestCluster {
        pg: _pg,
        url,
        secret,
        keys: _keys,
        nodes,
    } = start_cluster_on("lease", &[lease, lease], hosts).await;
    let [mut a, mut b] = servers(nodes);
    let instance_a = a.instance().await;
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);

    let long = start_lang(&ca, "bash", "sleep 600").await;
    let info = ok(&ca, "create_session", json!({"language": "bash"})).await;
    let sid = info["session_id"].as_str().unwrap().to_string();
    known(&cb, &long).await;
    eventually(60, "the long run's containers exist on A's host", || {
        !hosts[0]
            .labelled(&format!("label=codebox.run={long}"))
            .is_empty()
    })
    .await;
    // While A answers, B forwards: the run is running there.
    let r = ok(&cb, "get_result", json!({"run_id": long})).await;
    assert_eq!(r["status"], "running", "{r}");

    drop(ca);
    a.signal_and_wait(libc::SIGKILL).await;
    let killed = Instant::now();
    // Until A's lease lapses, B still takes A for the run's holder: the call fails saying
    // that A does not answer (and to try again), or, between the lapse and B's next renewal
    // (which marks what A held), that A holds it; then B answers from the store.
    let mut last = Value::Null;
    let mut unanswered = 0;
    for _ in 0..300 {
        let res = call(&cb, "get_result", json!({"run_id": long})).await;
        if res.is_error == Some(true) {
            let msg = text(&res);
            assert!(
                (msg.contains("does not answer") || msg.contains("another codebox server"))
                    && msg.contains(&instance_a),
                "{msg}"
            );
            unanswered += 1;
        } else {
            last = res.structured_content.expect("structured content");
            if last["status"] == "sandbox_error" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let noticed = killed.elapsed();
    assert_eq!(
        (last["status"].as_str(), last["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{last}"
    );
    let ended = tool_error(
        &cb,
        "run_code",
        json!({"language": "bash", "session_id": sid, "code": "echo 1"}),
    )
    .await;
    assert!(ended.contains("the server that held it stopped"), "{ended}");
    // B keeps serving.
    let r = ok(
        &cb,
        "run_code",
        json!({"language": "bash", "code": "echo still"}),
    )
    .await;
    assert_eq!(r["stdout"], "still\n", "{r}");

    // A's containers (its run's, its session's) stay on A's host, the only one that has
    // any, until that host gets a server again (on A's data directory), which reaps them.
    let instance_filter = format!("label=codebox.instance={instance_a}");
    assert!(!hosts[0].labelled(&instance_filter).is_empty());
    assert!(hosts[1].labelled(&instance_filter).is_empty());
    assert!(
        labelled_objects(&instance_filter).is_empty(),
        "none on the machine's daemon"
    );
    let mut a2 = node_on(a.into_data(), &url, &secret, lease, Some(&hosts[0])).await;
    eventually(60, "the killed server's containers are removed", || {
        hosts[0].labelled(&instance_filter).is_empty()
    })
    .await;
    eprintln!(
        "lease 3 s: the killed server's run was marked {:.1} s after the kill ({unanswered} calls \
         in between said its server does not answer); whole test {:.1} s",
        noticed.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(cb);
    a2.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_a_server_finishing_what_it_holds_and_losing_nothing() {
    let t0 = Instant::now();
    let TestCluster {
        pg: _pg,
        keys: _keys,
        nodes,
        ..
    } = start_cluster("drain", &[&["runs.max_concurrent_runs=2"], &[]]).await;
    let [mut a, mut b] = servers(nodes);
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    const RUNS: usize = 6;
    let mut ids = Vec::new();
    for i in 0..RUNS {
        ids.push(start(&ca, &format!("import time\ntime.sleep(1.5)\nprint({i})")).await);
    }
    known(&cb, ids.last().unwrap()).await;
    // Two run, four wait in A's queue when A is told to stop.
    // SAFETY: a signal to the child this test started.
    assert_eq!(unsafe { libc::kill(a.pid(), libc::SIGTERM) }, 0);
    let http = reqwest::Client::new();
    eventually(30, "A's /healthz says it drains", || {
        let url = a.http_url("/healthz");
        let http = http.clone();
        std::thread::spawn(move || {
            tokio::runtime::Runtime::new()
                .unwrap()
                .block_on(async { http.get(url).send().await.map(|r| r.status().as_u16()) })
        })
        .join()
        .unwrap()
        .is_ok_and(|s| s == 503)
    })
    .await;
    let refused = tool_error(
        &ca,
        "start_run",
        json!({"language": "python", "code": "print(1)"}),
    )
    .await;
    assert!(refused.contains("shutting down"), "{refused}");
    // Every run it held ends as it would have, read through B (forwarded to A while it
    // drains, from the store once it is gone).
    for (i, id) in ids.iter().enumerate() {
        let r = ok(&cb, "get_result", json!({"run_id": id, "wait_seconds": 60})).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("{i}\n").as_str())),
            "{r}"
        );
    }
    drop(ca);
    let status = a.wait(Duration::from_secs(120)).await;
    assert!(status.success(), "A exited with {status}");
    let rows = ok(&cb, "get_execution_history", json!({"limit": 100})).await;
    let rows = rows["runs"].as_array().unwrap();
    for id in &ids {
        let row = rows
            .iter()
            .find(|r| r["run_id"] == id.as_str())
            .expect("recorded");
        assert_eq!(row["status"], "succeeded", "{row}");
    }
    for id in &ids {
        assert!(leftovers(id).is_empty(), "run {id} left containers");
    }
    eprintln!(
        "drain of {RUNS} runs: whole test {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    drop(cb);
    b.signal_and_wait(libc::SIGTERM).await;
}

/// Debian's nginx in front of the servers (`scripts/ensure-nginx.sh` installs it), with a
/// config of its own on a loopback port: round robin, keepalive to the servers, no
/// buffering and long timeouts so that long polls (`wait_seconds`) and streams pass whole.
/// Stopped (by its PID) when dropped.
struct Nginx {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

const NGINX: &str = "/usr/sbin/nginx";

impl Nginx {
    fn start(upstreams: &[String]) -> Nginx {
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

    fn url(&self, path: &str) -> String {
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
async fn history_through(http: &reqwest::Client, nodes: &[ServeChild], nginx: &Nginx) -> Value {
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

/// One run of the mixed load, in the languages the private hosts have (Bash, AWK, Lua): its
/// request and what its report must say (status, stdout).
fn mixed(i: usize) -> (Value, &'static str, String) {
    match i % 6 {
        0 => (
            json!({"language": "bash", "code": format!("echo $(( {i} * 2 ))")}),
            "succeeded",
            format!("{}\n", i * 2),
        ),
        1 => (
            json!({"language": "bash", "code": format!("echo b{i}; exit 3")}),
            "failed",
            format!("b{i}\n"),
        ),
        2 => (
            json!({"language": "lua", "code": format!("print('l{i}')")}),
            "succeeded",
            format!("l{i}\n"),
        ),
        3 => (
            json!({"language": "awk", "code": "{ printf \"%s\", toupper($0) }", "stdin": format!("in{i}")}),
            "succeeded",
            format!("IN{i}"),
        ),
        4 => (
            json!({"language": "lua", "code": format!("print('unclosed {i}'")}),
            "compile_error",
            String::new(),
        ),
        _ => (
            json!({"language": "bash", "code": format!("echo e{i} >&2; echo o{i}")}),
            "succeeded",
            format!("o{i}\n"),
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_behind_nginx_serve_runs_and_sessions_as_one() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let watch = watch(hosts);
    let slots: &[&str] = &["runs.max_concurrent_runs=2"];
    let TestCluster {
        pg: _pg,
        keys: _keys,
        nodes,
        ..
    } = start_cluster_on("nginx", &[slots, slots, slots], hosts).await;
    let mut instances = Vec::new();
    for n in &nodes {
        instances.push(n.instance().await);
    }
    let nginx = Nginx::start(
        &nodes
            .iter()
            .map(|n| n.addr.clone().unwrap())
            .collect::<Vec<_>>(),
    );
    let http = reqwest::Client::new();
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // Health checks through nginx reach each server in turn.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..6 {
        let h: Value = http
            .get(nginx.url("/healthz"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(h["status"], "ok", "{h}");
        seen.insert(h["instance"].as_str().unwrap().to_string());
    }
    assert_eq!(seen.len(), 3, "round robin over the three: {seen:?}");

    // Many runs from 16 clients at once through nginx: each answered once, right.
    const CLIENTS: usize = 16;
    const EACH: usize = 19;
    let t = Instant::now();
    let clients = (0..CLIENTS).map(|c| {
        let http = http.clone();
        let url = nginx.url("/v1/runs");
        async move {
            let mut ids = Vec::new();
            for k in 0..EACH {
                let i = c * EACH + k;
                let (request, status, stdout) = mixed(i);
                let r: Value = http
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .json(&request)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(
                    (r["status"].as_str(), r["stdout"].as_str()),
                    (Some(status), Some(stdout.as_str())),
                    "run {i} ({request}): {r}"
                );
                ids.push(r["run_id"].as_str().unwrap().to_string());
            }
            ids
        }
    });
    let ids: Vec<String> = futures_util::future::join_all(clients)
        .await
        .into_iter()
        .flatten()
        .collect();
    let burst = t.elapsed();
    // One history row per run, spread over the three servers.
    let rows = history_through(&http, &nodes, &nginx).await;
    let rows = rows["runs"].as_array().unwrap();
    let mut per_instance = std::collections::BTreeMap::<String, usize>::new();
    for id in &ids {
        let matching: Vec<&Value> = rows.iter().filter(|r| r["run_id"] == id.as_str()).collect();
        assert_eq!(matching.len(), 1, "run {id}: {matching:?}");
        assert!(matching[0]["status"] != "queued" && matching[0]["status"] != "running");
        *per_instance
            .entry(matching[0]["instance"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(
        per_instance.len(),
        3,
        "runs spread over the three: {per_instance:?}"
    );
    let unique: std::collections::BTreeSet<&String> = ids.iter().collect();
    assert_eq!(unique.len(), ids.len(), "each run one id");
    // And over the three hosts: each run's containers were made by the daemon of the server
    // its history row names, and by no other.
    let made_on = watch.hosts_of(&instances, &ids);
    let mut per_host = [0usize; 3];
    for id in &ids {
        let row = rows.iter().find(|r| r["run_id"] == id.as_str()).unwrap();
        let k = made_on[id];
        assert_eq!(
            row["instance"],
            instances[k].as_str(),
            "run {id} ran on host {k}"
        );
        per_host[k] += 1;
    }
    assert!(
        per_host.iter().all(|&n| n > 0),
        "runs on each host: {per_host:?}"
    );

    // A session through nginx, round robin: each call lands on the next server, and all
    // reach the one that holds it (one shell, its variables kept).
    let created: Value = http
        .post(nginx.url("/v1/sessions"))
        .bearer_auth(TOKEN)
        .json(&json!({"language": "bash"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let sid = created["session_id"]
        .as_str()
        .expect("a session")
        .to_string();
    let t = Instant::now();
    const STEPS: usize = 6;
    for k in 0..STEPS {
        let code = if k == 0 {
            "n=0; echo $n"
        } else {
            "n=$((n + 1)); echo $n"
        };
        let r: Value = http
            .post(nginx.url("/v1/runs"))
            .bearer_auth(TOKEN)
            .json(&json!({"language": "bash", "session_id": sid, "code": code}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(r["stdout"], format!("{k}\n"), "step {k}: {r}");
    }
    let steps = t.elapsed();
    let listing = http
        .get(nginx.url(&format!("/v1/sessions/{sid}/files")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);
    let closed: Value = http
        .delete(nginx.url(&format!("/v1/sessions/{sid}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (closed["closed"].as_bool(), closed["executions"].as_u64()),
        (Some(true), Some(STEPS as u64)),
        "{closed}"
    );

    eprintln!(
        "three servers behind nginx, a private Docker host each: {} mixed runs from {CLIENTS} \
         clients in {:.1} s ({:.1} runs/s), per host {per_host:?}; a session's {STEPS} steps \
         round robin (two in three forwarded) in {:.2} s; whole test {:.1} s",
        ids.len(),
        burst.as_secs_f64(),
        ids.len() as f64 / burst.as_secs_f64(),
        steps.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    drop(nginx);
    let t = Instant::now();
    for mut n in nodes {
        n.signal_and_wait(libc::SIGTERM).await;
    }
    eprintln!(
        "the three servers stopped in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    // Nothing of any run is left on any host.
    assert_eq!(
        on_hosts(hosts, "label=codebox.managed=true"),
        Vec::<String>::new()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_database_outage_the_servers_do_not_take_each_other_for_dead() {
    let lease: &[&str] = &["cluster.lease_seconds=3"];
    let TestCluster {
        mut pg,
        keys: _keys,
        nodes,
        ..
    } = start_cluster("outage", &[lease, lease]).await;
    let [mut a, mut b] = servers(nodes);
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    // Each holds a session and a run: whichever reconnects first could take the other for
    // dead.
    let mut held = Vec::new();
    for client in [&ca, &cb] {
        let info = ok(client, "create_session", json!({"language": "python"})).await;
        let sid = info["session_id"].as_str().unwrap().to_string();
        let run = ok(
            client,
            "start_run",
            json!({"language": "python", "code": "import time\ntime.sleep(35)\nprint('through')",
                   "limits": {"timeout_seconds": 60}}),
        )
        .await["run_id"]
            .as_str()
            .unwrap()
            .to_string();
        held.push((sid, run));
    }
    for (_, run) in &held {
        known(&ca, run).await;
        known(&cb, run).await;
    }

    // The database goes away for longer than two leases, then comes back: each server
    // reconnects (within its retry interval) and must not mark the other's work.
    pg.pause();
    tokio::time::sleep(Duration::from_secs(8)).await;
    pg.restart();
    for _ in 0..200 {
        let res = call(&ca, "get_execution_history", json!({"limit": 10})).await;
        if res.is_error != Some(true) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Past the time a server judges leases again after a reconnection (5 s + the lease),
    // and a renewal more.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rows = ok(&ca, "get_execution_history", json!({"limit": 10})).await;
    for (_, run) in &held {
        let row = rows["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == run.as_str())
            .unwrap_or_else(|| panic!("{rows}"))
            .clone();
        // Still running (a loaded machine may have let it finish: never marked, all the same).
        assert!(
            matches!(row["status"].as_str(), Some("running" | "succeeded")),
            "after the outage: {row}"
        );
    }
    // Each session, through the other server.
    for ((sid, _), other) in held.iter().zip([&cb, &ca]) {
        let r = ok(
            other,
            "run_code",
            json!({"language": "python", "session_id": sid, "code": "print('still open')"}),
        )
        .await;
        assert_eq!(r["stdout"], "still open\n", "{r}");
    }
    for ((_, run), other) in held.iter().zip([&cb, &ca]) {
        let r = ok(
            other,
            "get_result",
            json!({"run_id": run, "wait_seconds": 60}),
        )
        .await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some("through\n")),
            "{r}"
        );
    }
    drop((ca, cb));
    a.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
    for (_, run) in &held {
        assert!(leftovers(run).is_empty());
    }
}

// ---- the shared queue itself, on a throwaway PostgreSQL (no Docker)

fn store_of(url: &str) -> codebox::config::HistoryStore {
    codebox::config::HistoryStore::Postgres {
        url: url.to_string(),
        password_file: None,
    }
}

/// A run for the queue, submitted by `instance`, taking one slot and `charge_mb`.
fn queued_run(instance: &str, i: usize, charge_mb: u64) -> codebox::history::Submitted {
    use codebox::report::{RunLimits, RunReport, Status};
    let run_id = format!("run-q{i:04}-{instance}");
    let limits = RunLimits {
        memory_mb: 256,
        timeout_seconds: 10.0,
        cpus: 1.0,
    };
    let base = RunReport::new(&run_id, "python", Status::Queued, limits, "queued");
    codebox::history::Submitted {
        row: codebox::history::NewRun::new(
            &run_id,
            "python",
            limits,
            &format!("print({i})"),
            codebox::config::CodePolicy::Preview,
            instance,
        ),
        request: json!({"language": "python", "code": format!("print({i})")}).to_string(),
        base: serde_json::to_string(&base).unwrap(),
        slots: 1,
        charge_mb,
        claim_here: false,
    }
}

/// `queue.submit(run)`, tried again while the queue's thread is still making the table (the
/// first submit of a test may come before it): whether it was claimed here at once.
async fn submit_when_ready(
    queue: &codebox::history::SharedQueue,
    run: &codebox::history::Submitted,
) -> bool {
    let mut tries = 0;
    loop {
        match queue.submit(run.clone()).await {
            Ok(claimed) => return claimed,
            Err(e) => {
                tries += 1;
                assert!(tries < 50, "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn room(slots: usize, memory_mb: u64) -> codebox::history::Room {
    codebox::history::Room {
        slots,
        memory_mb,
        max_slots: 4,
        budget_mb: 4096,
    }
}

/// `(claimed_by, handed_back)` of each queue row, by run id.
fn queue_rows(
    pg: &PgCluster,
    db: &str,
) -> std::collections::BTreeMap<String, (Option<String>, i64)> {
    pg.with_client(db, |c| {
        c.query("SELECT run_id, claimed_by, handed_back FROM queue", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    })
}

/// Claims in submission order within the room; a head too big for the room holds back what
/// follows (as one server's queue does), one too big for the server ever is left to others;
/// a queued run is withdrawn by any server; a dead server's unstarted claims go back to the
/// queue exactly once, whoever judges, and its runs' rows are not failed for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_queue_claims_in_order_and_gives_a_dead_servers_claims_back_once() {
    use codebox::history::{History, Owner, SharedQueue};
    let pg = PgCluster::start();
    let url = pg.create_database("queue");
    let store = store_of(&url);
    let qa = SharedQueue::connect(&store, "qa").expect("a queue for PostgreSQL");
    let qb = SharedQueue::connect(&store, "qb").unwrap();
    let qc = SharedQueue::connect(&store, "qc").unwrap();
    // C is alive: it renews a lease (B never does). A long one: C judges others' leases at
    // each renewal (every third of its lease), and must not hand B's claim back before the
    // judges below are meant to, as it did on a loaded machine with the default 10 s.
    let c_dir = tempfile::tempdir().unwrap();
    let hc = History::connect(
        &store,
        Owner {
            instance: "qc".into(),
            data_dir: c_dir.path().to_path_buf(),
            lease: Duration::from_secs(300),
            ..Default::default()
        },
    );
    let sqlite = codebox::config::HistoryStore::Sqlite("/nonexistent/h.db".into());
    assert!(
        SharedQueue::connect(&sqlite, "x").is_none(),
        "SQLite has no shared queue"
    );
    let ids: Vec<String> = (0..6)
        .map(|i| {
            queued_run("qa", i, if i == 2 { 9000 } else { 300 })
                .row
                .run_id
        })
        .collect();
    for i in 0..6 {
        let run = queued_run("qa", i, if i == 2 { 9000 } else { 300 });
        submit_when_ready(&qa, &run).await;
    }
    // B has room for one run of 300 MB: the first in order.
    let got = qb.claim(room(1, 400)).await.unwrap();
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&ids[0]]);
    // C: room for 3, but only 500 MB: run 1 fits, then run 2 (9000 MB) can never fit a
    // 4096 MB budget and is skipped; run 3 does not fit the 200 MB left, and holds back 4.
    let got = qc.claim(room(3, 500)).await.unwrap();
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&ids[1]]);
    let rows = queue_rows(&pg, "queue");
    assert_eq!(rows[&ids[0]].0.as_deref(), Some("qb"));
    assert_eq!(rows[&ids[2]].0, None);
    // The history row follows its claimer (whom the others forward to).
    let owner: String = pg.with_client("queue", |c| {
        c.query_one("SELECT instance FROM runs WHERE id = $1", &[&ids[0]])
            .unwrap()
            .get(0)
    });
    assert_eq!(owner, "qb");
    // Any server takes an unclaimed run out; a claimed one is not its to take.
    let stopped = qc
        .withdraw(
            &ids[3],
            "stopped while waiting in the queue; it never started",
        )
        .await
        .unwrap()
        .expect("withdrawn");
    assert_eq!(stopped.status, codebox::report::Status::Stopped);
    assert!(qc.withdraw(&ids[0], "x").await.unwrap().is_none());
    assert!(
        qc.withdraw(&ids[3], "x").await.unwrap().is_none(),
        "only once"
    );
    let status: String = pg.with_client("queue", |c| {
        c.query_one("SELECT status FROM runs WHERE id = $1", &[&ids[3]])
            .unwrap()
            .get(0)
    });
    assert_eq!(status, "stopped");
    // C starts its run: it leaves the queue.
    qc.settle(&ids[1]);
    eventually(10, "a started run leaves the queue", || {
        !queue_rows(&pg, "queue").contains_key(&ids[1])
    })
    .await;

    // B dies (it never renews a lease). Two judges with a 1 s lease: B's claim goes back once,
    // its run is queued again, not failed.
    let judges: Vec<(History, tempfile::TempDir)> = ["judge1", "judge2"]
        .iter()
        .map(|name| {
            let dir = tempfile::tempdir().unwrap();
            let h = History::connect(
                &store,
                Owner {
                    instance: name.to_string(),
                    data_dir: dir.path().to_path_buf(),
                    lease: Duration::from_secs(1),
                    advertise_url: None,
                },
            );
            (h, dir)
        })
        .collect();
    eventually(30, "B's claim is back in the queue", || {
        queue_rows(&pg, "queue")[&ids[0]].0.is_none()
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rows = queue_rows(&pg, "queue");
    assert_eq!(rows[&ids[0]], (None, 1), "given back exactly once");
    let (status, instance): (String, String) = pg.with_client("queue", |c| {
        let r = c
            .query_one(
                "SELECT status, instance FROM runs WHERE id = $1",
                &[&ids[0]],
            )
            .unwrap();
        (r.get(0), r.get(1))
    });
    assert_eq!(status, "queued", "a run given back is not failed");
    assert_eq!(instance, "qb");
    // The next claim takes it first, in order.
    let got = qc.claim(room(2, 700)).await.unwrap();
    assert_eq!(
        got.iter().map(|c| &c.run_id).collect::<Vec<_>>(),
        [&ids[0], &ids[4]]
    );
    // Handing back is this server's own claims only.
    assert_eq!(qb.hand_back(vec![ids[4].clone()]).await.unwrap(), 0);
    assert_eq!(qc.hand_back(vec![ids[4].clone()]).await.unwrap(), 1);
    for (h, _) in &judges {
        h.flush(Duration::from_secs(5)).await;
    }
    hc.flush(Duration::from_secs(5)).await;
}

/// A run submitted to a server with room is claimed there at once, unless an older run that
/// it could take as well waits unclaimed: then it waits behind that one, which the server's
/// claimer takes first. So the order is the database's, whichever server a run was sent to
/// (what a cluster test's set-up met under load: a run sent to B a moment later reached the
/// database first, and A ran it before its own second run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_sent_to_a_server_with_room_waits_behind_an_older_one_that_fits() {
    use codebox::history::SharedQueue;
    let pg = PgCluster::start();
    let url = pg.create_database("arrival");
    let store = store_of(&url);
    let qa = SharedQueue::connect(&store, "qa").expect("a queue for PostgreSQL");
    let qb = SharedQueue::connect(&store, "qb").unwrap();
    // B has no room: its run waits unclaimed.
    let older = queued_run("qb", 0, 300);
    submit_when_ready(&qb, &older).await;
    // A has room, but the older run would fit it as well: A's run waits behind it.
    let newer = codebox::history::Submitted {
        claim_here: true,
        ..queued_run("qa", 1, 300)
    };
    assert!(
        !qa.submit(newer.clone()).await.unwrap(),
        "it jumped the older run"
    );
    // A run smaller than the older one (100 MB, where that one asks 300) is A's at once: room
    // that fits it need not fit the older run.
    let small = codebox::history::Submitted {
        claim_here: true,
        ..queued_run("qa", 2, 100)
    };
    assert!(qa.submit(small.clone()).await.unwrap());
    // A's claimer, with room for one, takes the older run first.
    let got = qa.claim(room(1, 4096)).await.unwrap();
    let (older, newer, small) = (older.row.run_id, newer.row.run_id, small.row.run_id);
    assert_eq!(got.iter().map(|c| &c.run_id).collect::<Vec<_>>(), [&older]);
    let rows = queue_rows(&pg, "arrival");
    assert_eq!(rows[&older].0.as_deref(), Some("qa"));
    assert_eq!(rows[&newer].0, None);
    assert_eq!(rows[&small].0.as_deref(), Some("qa"));
}

/// The queue's own cost, without Docker (`--ignored`; figures in docs/PERFORMANCE.md):
/// `N` runs submitted by three servers and claimed by three, one slot at a time as a busy
/// cluster does, then settled. Prints claims per second and what a run pays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn shared_queue_throughput() {
    use codebox::history::SharedQueue;
    const N: usize = 600;
    let pg = PgCluster::start();
    let url = pg.create_database("bench");
    let store = store_of(&url);
    let queues: Vec<SharedQueue> = ["s1", "s2", "s3"]
        .iter()
        .map(|s| SharedQueue::connect(&store, s).unwrap())
        .collect();
    // Warm: the schema exists and the connections are open.
    let mut warm = queued_run("s1", 99_999, 1);
    warm.row.run_id = "warm".into();
    submit_when_ready(&queues[0], &warm).await;
    let _ = queues[0].claim(room(1, 100)).await.unwrap();
    let t = Instant::now();
    let submits = queues.iter().enumerate().map(|(k, q)| async move {
        for i in (k..N).step_by(3) {
            q.submit(queued_run("s", i, 100)).await.unwrap();
        }
    });
    futures_util::future::join_all(submits).await;
    let submitted = t.elapsed();
    let t = Instant::now();
    let claims = queues.iter().map(|q| async move {
        let mut got = 0;
        loop {
            let c = q.claim(room(1, 1000)).await.unwrap();
            if c.is_empty() {
                return got;
            }
            for c in c {
                q.settle(&c.run_id);
                got += 1;
            }
        }
    });
    let got: Vec<usize> = futures_util::future::join_all(claims).await;
    let claimed = t.elapsed();
    assert_eq!(got.iter().sum::<usize>(), N, "{got:?}");
    eprintln!(
        "shared queue, {N} runs, 3 servers: submit {:.2} ms a run ({:.0}/s), claim {:.2} ms a run ({:.0} claims/s), spread {got:?}",
        submitted.as_secs_f64() * 1000.0 / N as f64,
        N as f64 / submitted.as_secs_f64(),
        claimed.as_secs_f64() * 1000.0 / N as f64,
        N as f64 / claimed.as_secs_f64(),
    );
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

/// One queue for all (SPEC section 15), on real servers, each on a Docker host of its own:
/// 12 runs sent to a server with one slot are run by the others too, on their hosts; then, with every slot busy, a server killed
/// outright: its running run is `sandbox_error`, the runs sent to it that waited in the
/// shared queue run on the others, each reported once; nothing is left in the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_servers_runs_go_to_the_others_and_a_killed_ones_queue_is_not_lost() {
    let t0 = Instant::now();
    let (_hosts_alone, hosts) = private_hosts().await;
    let watch = watch(hosts);
    let one: &[&str] = &["runs.max_concurrent_runs=1", "cluster.lease_seconds=3"];
    let two: &[&str] = &["runs.max_concurrent_runs=2", "cluster.lease_seconds=3"];
    let TestCluster {
        pg,
        url,
        secret,
        keys: _keys,
        nodes,
    } = start_cluster_on("busy", &[one, two, two], hosts).await;
    let [mut a, mut b, mut c] = servers(nodes);
    let names = [a.instance().await, b.instance().await, c.instance().await];
    let (ca, cb) = (a.client(TOKEN).await, b.client(TOKEN).await);
    eprintln!("set-up: {:.1} s", t0.elapsed().as_secs_f64());

    // 12 runs to A, which has one slot.
    let t = Instant::now();
    let mut ids = Vec::new();
    for i in 0..12 {
        ids.push(start_lang(&ca, "bash", &format!("sleep 1; echo {i}")).await);
    }
    for (i, id) in ids.iter().enumerate() {
        let r = final_report(&ca, id).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("{i}\n").as_str())),
            "{r}"
        );
    }
    let busy = t.elapsed();
    let spread = ran_on(&ca, &ids).await;
    let count = |name: &str| spread.iter().filter(|(i, _)| i == name).count();
    let counts = [count(&names[0]), count(&names[1]), count(&names[2])];
    assert_eq!(counts.iter().sum::<usize>(), 12, "{spread:?}");
    assert!(
        counts[1] > 0 && counts[2] > 0,
        "B and C ran some: {counts:?}"
    );
    // On their own hosts: each run's containers were made by its server's daemon only.
    let made_on = watch.hosts_of(&names, &ids);
    for (id, (instance, _)) in ids.iter().zip(&spread) {
        assert_eq!(instance, &names[made_on[id]], "run {id}");
    }
    eprintln!(
        "12 runs of 1 s sent to a server with 1 slot: {:.1} s, run by A/B/C {counts:?}",
        busy.as_secs_f64()
    );

    // Every slot busy: one long run on A (sent to A while it is idle: its own), then two
    // each on B and C (sent to B).
    let held = start_lang(&ca, "bash", "sleep 600").await;
    eventually(60, "A's long run is running on A's host", || {
        !hosts[0]
            .labelled(&format!("label=codebox.run={held}"))
            .is_empty()
    })
    .await;
    let mut long = Vec::new();
    for _ in 0..4 {
        long.push(start_lang(&cb, "bash", "sleep 15; echo long").await);
    }
    eventually(60, "the four long runs are running", || {
        long.iter().all(|id| !left_on_hosts(hosts, id).is_empty())
    })
    .await;
    // Six more to A: no server has room, they wait in the shared queue.
    let mut queued = Vec::new();
    for i in 0..6 {
        queued.push(start_lang(&ca, "bash", &format!("echo 'queued {i}'")).await);
    }
    for id in &queued {
        let r = ok(&cb, "get_result", json!({"run_id": id})).await;
        assert_eq!(r["status"], "queued", "{r}");
    }
    drop(ca);
    a.signal_and_wait(libc::SIGKILL).await;
    for (i, id) in queued.iter().enumerate() {
        let r = final_report(&cb, id).await;
        assert_eq!(
            (r["status"].as_str(), r["stdout"].as_str()),
            (Some("succeeded"), Some(format!("queued {i}\n").as_str())),
            "{r}"
        );
    }
    let mut last = Value::Null;
    for _ in 0..300 {
        let res = call(&cb, "get_result", json!({"run_id": held})).await;
        if res.is_error != Some(true) {
            last = res.structured_content.expect("structured content");
            if last["status"] == "sandbox_error" {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        (last["status"].as_str(), last["message"].as_str()),
        (Some("sandbox_error"), Some("its server stopped answering")),
        "{last}"
    );
    for id in &long {
        assert_eq!(final_report(&cb, id).await["status"], "succeeded");
    }
    // The history row trails the answer by a moment (its server writes it after answering).
    let mut after = ran_on(&cb, &queued).await;
    for _ in 0..100 {
        if after.iter().all(|(_, s)| s == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = ran_on(&cb, &queued).await;
    }
    assert!(
        after
            .iter()
            .all(|(i, s)| i != &names[0] && s == "succeeded"),
        "{after:?}"
    );
    let left: i64 = pg.with_client("busy", |c| {
        c.query_one("SELECT COUNT(*) FROM queue", &[])
            .unwrap()
            .get(0)
    });
    assert_eq!(left, 0, "nothing is left in the shared queue");
    eprintln!("whole test {:.1} s", t0.elapsed().as_secs_f64());
    // The queued runs ran on B's and C's hosts.
    let made_on = watch.hosts_of(&names, &queued);
    assert!(queued.iter().all(|id| made_on[id] != 0), "{made_on:?}");
    drop(cb);
    // A's containers stay on A's host, and only there (B and C reap only what their own
    // daemons hold), until that host next gets a server on A's data directory.
    let instance_filter = format!("label=codebox.instance={}", names[0]);
    assert!(!hosts[0].labelled(&instance_filter).is_empty());
    assert!(on_hosts(&hosts[1..], &instance_filter).is_empty());
    assert!(
        labelled_objects(&instance_filter).is_empty(),
        "none on the machine's daemon"
    );
    let mut a2 = node_on(a.into_data(), &url, &secret, one, Some(&hosts[0])).await;
    eventually(60, "the killed server's containers are removed", || {
        hosts[0].labelled(&instance_filter).is_empty()
    })
    .await;
    a2.signal_and_wait(libc::SIGTERM).await;
    b.signal_and_wait(libc::SIGTERM).await;
    c.signal_and_wait(libc::SIGTERM).await;
    assert!(on_hosts(hosts, "label=codebox.managed=true").is_empty());
}

/// Throughput through nginx with 1, 2 and 3 servers, each on a private Docker host of its
/// own (`--ignored`; figures in docs/PERFORMANCE.md): the same 120 short Bash runs from 16
/// clients each time, after a few to warm up; and one server with the three servers' slots
/// (12), to tell more slots from more servers. Twice, the second time in reverse order (the
/// machine's other load drifts). Prints runs per second and the spread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput_through_nginx_with_one_two_and_three_servers() {
    const RUNS: usize = 120;
    const CLIENTS: usize = 16;
    let (_hosts_alone, hosts) = private_hosts().await;
    let mut lines = Vec::new();
    let default_slots: &[&str] = &[];
    let twelve_slots: &[&str] = &["runs.max_concurrent_runs=12"];
    let configs = [
        (1, default_slots),
        (2, default_slots),
        (3, default_slots),
        (1, twelve_slots),
    ];
    for (servers, extra) in configs.iter().chain(configs.iter().rev()).copied() {
        let settings = vec![extra; servers];
        let TestCluster {
            pg: _pg,
            keys: _keys,
            nodes,
            ..
        } = start_cluster_on(&format!("bench{}", lines.len()), &settings, hosts).await;
        let mut instances = Vec::new();
        for n in &nodes {
            instances.push(n.instance().await);
        }
        let nginx = Nginx::start(
            &nodes
                .iter()
                .map(|n| n.addr.clone().unwrap())
                .collect::<Vec<_>>(),
        );
        let http = reqwest::Client::new();
        let url = nginx.url("/v1/runs");
        let run = |i: usize| {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let r: Value = http
                    .post(&url)
                    .bearer_auth(TOKEN)
                    .json(&json!({"language": "bash", "code": format!("echo {i}")}))
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                assert_eq!(
                    (r["status"].as_str(), r["stdout"].as_str()),
                    (Some("succeeded"), Some(format!("{i}\n").as_str())),
                    "{r}"
                );
                r["run_id"].as_str().unwrap().to_string()
            }
        };
        for i in 0..2 * servers {
            run(100_000 + i).await;
        }
        let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let t = Instant::now();
        let clients = (0..CLIENTS).map(|_| {
            let next = next.clone();
            async move {
                let mut ids = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= RUNS {
                        return ids;
                    }
                    ids.push(run(i).await);
                }
            }
        });
        let ids: Vec<String> = futures_util::future::join_all(clients)
            .await
            .into_iter()
            .flatten()
            .collect();
        let took = t.elapsed();
        assert_eq!(ids.len(), RUNS);
        let rows = history_through(&http, &nodes, &nginx).await;
        let spread: Vec<usize> = instances
            .iter()
            .map(|i| {
                rows["runs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|r| {
                        r["instance"] == i.as_str()
                            && ids.contains(&r["run_id"].as_str().unwrap().to_string())
                    })
                    .count()
            })
            .collect();
        let slots = if extra.is_empty() { 4 } else { 12 };
        lines.push(format!(
            "{servers} server(s) of {slots} slots, a private Docker host each, through nginx: \
             {RUNS} Bash runs from {CLIENTS} clients in {:.1} s = {:.1} runs/s, spread {spread:?}",
            took.as_secs_f64(),
            RUNS as f64 / took.as_secs_f64()
        ));
        eprintln!("{}", lines.last().unwrap());
        drop(nginx);
        for mut n in nodes {
            n.signal_and_wait(libc::SIGTERM).await;
        }
    }
    for line in &lines {
        eprintln!("{line}");
    }
}
