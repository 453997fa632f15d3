//! Load through the real binary over HTTP: 16 MCP clients (sessions of their own, bearer
//! token) submit 500 runs to one `codebox serve`, in python, bash, cpp and javascript, with
//! every outcome (succeeded, failed, compile_error, timed_out with a short limit,
//! out_of_memory with a small memory limit, stopped with stop_run while running), some
//! through `run_code` and most through `start_run` + `get_result`. The queue is kept small
//! (`runs.max_queued_runs` 8 beside 4 running) so that submissions are refused; each refusal
//! must be a clean tool error that says to retry, and the client retries.
//!
//! Checked: every accepted run ends with the outcome its program asks for and exactly one
//! final report (the same one on a later `get_result`), exactly one history row with that
//! status (over MCP and in the SQLite file after the server stopped), the server's counters
//! agree, and nothing of its instance is left on the daemon. Printed: runs/s, refusals, the
//! server's peak RSS.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};

use crate::mcp_support::{eventually, params, text};
use crate::serve_child::{instance_objects, Options, ServeChild};

const CLIENTS: usize = 16;
const RUNS: usize = 500;
const TOKEN: &str = "load-token-0123456789abcdef";
/// The bound on the server's peak RSS: far above the 35 MB measured on 2026-12-01 (debug
/// build); it only catches a leak.
const PEAK_RSS_BOUND_KB: u64 = 512 * 1024;

type Client = RunningService<RoleClient, ()>;

/// One run of the mix: what to send and what must come back.
struct Job {
    language: &'static str,
    code: String,
    limits: Option<Value>,
    args: Vec<String>,
    /// The final status it must end with.
    expect: &'static str,
    /// stdout it must print, when it succeeds.
    stdout: Option<String>,
    /// Stop it with stop_run once it runs.
    stop: bool,
    /// Through run_code (waits) rather than start_run + get_result.
    run_code: bool,
}

/// The `i`th job: the mix is fixed, so a failure can be replayed.
fn job(i: usize) -> Job {
    let mut j = Job {
        language: "python",
        code: String::new(),
        limits: None,
        args: Vec::new(),
        expect: "succeeded",
        stdout: None,
        stop: false,
        run_code: i % 4 == 3,
    };
    match i % 20 {
        0..=3 => {
            j.code = format!("print({i} * 2)");
            j.stdout = Some(format!("{}\n", i * 2));
        }
        4 | 5 => {
            j.language = "bash";
            j.code = "echo \"bash $1\"".into();
            j.args = vec![i.to_string()];
            j.stdout = Some(format!("bash {i}\n"));
        }
        6 | 7 => {
            j.language = "javascript";
            j.code = format!("console.log({i} + 1)");
            j.stdout = Some(format!("{}\n", i + 1));
        }
        8 | 9 => {
            // Five programs, so most runs find their build in the compile cache.
            j.language = "cpp";
            j.code = format!(
                "#include <cstdio>\nint main(int, char** v) {{ std::printf(\"cpp%d %s\\n\", {}, v[1]); }}\n",
                i % 5
            );
            j.args = vec![i.to_string()];
            j.stdout = Some(format!("cpp{} {i}\n", i % 5));
        }
        10 => {
            j.language = "bash";
            j.code = "echo no >&2; exit 3".into();
            j.expect = "failed";
        }
        11 => {
            j.code = "raise SystemExit(7)".into();
            j.expect = "failed";
        }
        12 => {
            j.language = "cpp";
            j.code = "int main() { return undeclared; }".into();
            j.expect = "compile_error";
        }
        13 => {
            j.code = "def broken(:\n".into();
            j.expect = "compile_error";
        }
        14 => {
            j.code = "while True:\n    pass".into();
            j.limits = Some(json!({"timeout_seconds": 0.5}));
            j.expect = "timed_out";
        }
        15 => {
            j.language = "bash";
            j.code = "sleep 5".into();
            j.limits = Some(json!({"timeout_seconds": 0.5}));
            j.expect = "timed_out";
        }
        16 => {
            j.code = "b = bytearray(200 * 1024 * 1024)\nprint(len(b))".into();
            j.limits = Some(json!({"memory_mb": 32}));
            j.expect = "out_of_memory";
        }
        17 => {
            j.language = "cpp";
            j.code = "#include <cstdio>\n#include <vector>\nint main() { std::vector<char> v(200u << 20, 1); std::printf(\"%d\\n\", v[12345]); }\n".into();
            j.limits = Some(json!({"memory_mb": 64}));
            j.expect = "out_of_memory";
        }
        18 => {
            j.language = "bash";
            j.code = "sleep 30".into();
            j.limits = Some(json!({"timeout_seconds": 60}));
            j.expect = "stopped";
            j.stop = true;
            j.run_code = false;
        }
        _ => {
            j.code = "import time\ntime.sleep(30)".into();
            j.limits = Some(json!({"timeout_seconds": 60}));
            j.expect = "stopped";
            j.stop = true;
            j.run_code = false;
        }
    }
    j
}

impl Job {
    fn arguments(&self) -> Value {
        let mut a = json!({"language": self.language, "code": self.code});
        if !self.args.is_empty() {
            a["args"] = json!(self.args);
        }
        if let Some(l) = &self.limits {
            a["limits"] = l.clone();
        }
        a
    }
}

async fn connect(url: &str) -> Client {
    let t = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url.to_string()).auth_header(TOKEN),
    );
    ().serve(t).await.expect("MCP client over HTTP")
}

/// Call a tool; a protocol error fails the test. Returns (is_error, structured or text).
async fn call(client: &Client, tool: &'static str, args: Value) -> (bool, Value) {
    let r = client
        .call_tool(params(tool, args.clone()))
        .await
        .unwrap_or_else(|e| panic!("{tool}({args}): protocol error {e}"));
    if r.is_error == Some(true) {
        (true, json!(text(&r)))
    } else {
        (
            false,
            r.structured_content.clone().expect("structured content"),
        )
    }
}

/// What the clients saw.
#[derive(Default)]
struct Tally {
    /// Final reports by run id: (job index, report).
    finals: HashMap<String, (usize, Value)>,
    /// Queue-full refusals, and how many of them said to retry.
    refused: usize,
    refused_retryable: usize,
    /// Anything unexpected, for the failure message.
    problems: Vec<String>,
}

/// Submit job `i` until accepted (retrying refusals), then see it to its end.
async fn run_job(client: &Client, i: usize, tally: &Mutex<Tally>) {
    let j = job(i);
    let tool = if j.run_code { "run_code" } else { "start_run" };
    let accepted = loop {
        let (is_error, v) = call(client, tool, j.arguments()).await;
        if !is_error {
            break v;
        }
        let message = v.as_str().unwrap_or_default().to_string();
        let retryable = message.contains("busy") && message.contains("retry");
        {
            let mut t = tally.lock().unwrap();
            t.refused += 1;
            if retryable {
                t.refused_retryable += 1;
            } else {
                t.problems
                    .push(format!("job {i}: {tool} refused: {message}"));
            }
        }
        if !retryable {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50 + (i as u64 * 37) % 200)).await;
    };
    let run_id = accepted["run_id"].as_str().unwrap().to_string();
    let report = if j.run_code {
        accepted
    } else if j.stop {
        // Wait until it runs, then stop it.
        loop {
            let (_, r) = call(client, "get_result", json!({"run_id": run_id})).await;
            match r["status"].as_str() {
                Some("queued") => tokio::time::sleep(Duration::from_millis(100)).await,
                _ => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        call(client, "stop_run", json!({"run_id": run_id})).await.1
    } else {
        loop {
            let (is_error, r) = call(
                client,
                "get_result",
                json!({"run_id": run_id, "wait_seconds": 60}),
            )
            .await;
            assert!(!is_error, "get_result {run_id}: {r}");
            if !matches!(r["status"].as_str(), Some("queued" | "running")) {
                break r;
            }
        }
    };
    let mut t = tally.lock().unwrap();
    let status = report["status"].as_str().unwrap_or("?");
    if status != j.expect {
        t.problems.push(format!(
            "job {i} ({} {:?}) ended {status}, expected {}: {}",
            j.language,
            j.code.chars().take(40).collect::<String>(),
            j.expect,
            report["message"]
        ));
    } else if let Some(out) = &j.stdout {
        if report["stdout"] != json!(out) {
            t.problems.push(format!(
                "job {i} printed {}, expected {out:?}",
                report["stdout"]
            ));
        }
    }
    if t.finals.insert(run_id.clone(), (i, report)).is_some() {
        t.problems.push(format!("run {run_id} reported twice"));
    }
}

async fn history(client: &Client) -> Vec<Value> {
    let (is_error, h) = call(client, "get_execution_history", json!({"limit": 1000})).await;
    assert!(!is_error, "{h}");
    h["runs"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_load_16_clients_500_mixed_runs_each_reported_and_recorded_once_nothing_left() {
    let mut server = ServeChild::start(Options {
        http_token: Some(TOKEN),
        sets: &["runs.max_queued_runs=8", "runs.max_concurrent_runs=4"],
        ..Options::default()
    })
    .await;
    let instance = server.instance().await;
    let url = server.http_url("/mcp");
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(&url).await);
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let workers = clients.into_iter().map(|client| {
        let (tally, next) = (tally.clone(), next.clone());
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= RUNS {
                    break;
                }
                run_job(&client, i, &tally).await;
            }
            client
        })
    });
    let clients: Vec<Client> = futures_util::future::join_all(workers)
        .await
        .into_iter()
        .map(|r| r.expect("a client task panicked"))
        .collect();
    let elapsed = started.elapsed().as_secs_f64();
    let peak_kb = server.peak_rss_kb();

    let t = std::mem::take(&mut *tally.lock().unwrap());
    assert!(
        t.problems.is_empty(),
        "{} problems, e.g.:\n{}",
        t.problems.len(),
        t.problems[..t.problems.len().min(20)].join("\n")
    );
    assert_eq!(
        t.finals.len(),
        RUNS,
        "every job was accepted once and ended"
    );
    assert!(
        t.refused > 0,
        "the small queue refused nothing; the test proves nothing about refusals"
    );
    assert_eq!(t.refused, t.refused_retryable);
    let mut outcomes: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, r) in t.finals.values() {
        *outcomes.entry(r["status"].as_str().unwrap()).or_insert(0) += 1;
    }

    // The same final report on a later get_result.
    let client = &clients[0];
    for (run_id, (i, report)) in t.finals.iter() {
        let (is_error, again) = call(client, "get_result", json!({"run_id": run_id})).await;
        assert!(!is_error, "job {i}: {again}");
        assert_eq!(
            (&again["status"], &again["exit_code"], &again["stdout"]),
            (&report["status"], &report["exit_code"], &report["stdout"]),
            "job {i}: a second, different final report"
        );
    }
    // One history row per run, with its final status (rows are written in the background).
    let mut rows = history(client).await;
    for _ in 0..100 {
        let all_final = rows.len() == RUNS
            && rows.iter().all(|r| {
                t.finals
                    .get(r["run_id"].as_str().unwrap())
                    .is_some_and(|(_, f)| f["status"] == r["status"])
            });
        if all_final {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        rows = history(client).await;
    }
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for r in &rows {
        *by_id.entry(r["run_id"].as_str().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(
        rows.len(),
        RUNS,
        "one history row per accepted run, no more"
    );
    for (run_id, (i, report)) in t.finals.iter() {
        assert_eq!(
            by_id.get(run_id.as_str()),
            Some(&1),
            "job {i}: history rows"
        );
        let row = rows.iter().find(|r| r["run_id"] == json!(run_id)).unwrap();
        assert_eq!(row["status"], report["status"], "job {i}: history status");
    }
    // The server's own counters agree.
    let metrics = reqwest::Client::new()
        .get(server.http_url("/metrics"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counter = |prefix: &str| -> u64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    assert_eq!(counter("codebox_runs_total{"), RUNS as u64, "{metrics}");
    assert_eq!(
        counter("codebox_runs_rejected_total{reason=\"queue_full\"}"),
        t.refused as u64
    );

    // While it still runs, only the pool's containers and the sessions opened ahead of time
    // are there; once stopped, none.
    let run_containers = |instance: &str| {
        let out = std::process::Command::new("docker")
            .args(["ps", "-a", "--format", "{{.Label \"codebox.run\"}}"])
            .args(["--filter", &format!("label=codebox.instance={instance}")])
            .output()
            .expect("docker CLI");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                *l != codebox::executor::pool::POOL_RUN_LABEL
                    && *l != codebox::executor::session::SESSION_RUN_LABEL
            })
            .count()
    };
    eventually(60, "no run container is left while the server runs", || {
        run_containers(&instance) == 0
    })
    .await;
    drop(clients);
    let status = server.signal_and_wait(libc::SIGTERM).await;
    assert!(status.success(), "codebox serve exited with {status}");
    let (panics, tail) = server.stderr_report();
    assert!(panics.is_empty(), "{panics:?}\n{tail}");
    eventually(60, "nothing of the instance is left", || {
        instance_objects(&instance).is_empty()
    })
    .await;
    // The SQLite file agrees: one row per run, each final.
    let db = rusqlite::Connection::open(server.data_dir().join("history.sqlite3")).unwrap();
    let (rows, distinct, unfinished): (i64, i64, i64) = db
        .query_row(
            "SELECT COUNT(*), COUNT(DISTINCT id), SUM(status IN ('queued', 'running')) FROM runs",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .unwrap();
    assert_eq!((rows, distinct, unfinished), (RUNS as i64, RUNS as i64, 0));

    println!(
        "load over HTTP: {CLIENTS} clients, {RUNS} runs in {elapsed:.1} s = {:.2} runs/s; outcomes {outcomes:?}; {} queue-full refusals (all retryable, retried); peak RSS {} MB",
        RUNS as f64 / elapsed,
        t.refused,
        peak_kb / 1024
    );
    assert!(
        peak_kb < PEAK_RSS_BOUND_KB,
        "peak RSS {peak_kb} kB over {PEAK_RSS_BOUND_KB} kB"
    );
}
