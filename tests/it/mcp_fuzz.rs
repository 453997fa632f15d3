//! Protocol fuzzing of the real `codebox serve` binary, over stdio and over Streamable HTTP
//! (with a bearer token): thousands of malformed and hostile messages from the seeded
//! generator in `fuzz_gen` (the seed is printed; `CODEBOX_FUZZ_SEED` replays one,
//! `CODEBOX_FUZZ_MESSAGES` sets the count). Each test asserts that the server:
//! - never panics or exits (the process lives, `/healthz` answers over HTTP, and a valid
//!   request still gets its answer after the storm);
//! - answers every request that has an id, with a result or a JSON-RPC error carrying that
//!   id, and nothing else with an id;
//! - leaves no container or volume of its instance behind once it has stopped;
//! - keeps its peak RSS (`VmHWM`) under [`PEAK_RSS_BOUND_KB`], and reports it.
//!
//! Almost no message starts a real run (the few that do run `true` in bash), so the storm
//! is quick; the huge (10 MB) messages are capped to a handful per transport.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use crate::fuzz_gen::{self, canonical_id, owed, Generator, Message};
use crate::mcp_support::eventually;
use crate::serve_child::{instance_objects, Options, ServeChild};

/// Messages per transport unless `CODEBOX_FUZZ_MESSAGES` says otherwise.
const DEFAULT_MESSAGES: usize = 2400;
/// Messages that may start a real (tiny) run, per transport.
const MAX_RUNS: usize = 8;
/// Messages with a 10 MB string, per transport.
const MAX_HUGE: usize = 8;
/// The bound on the server's peak RSS. Measured 2026-12-01 (debug build): 130 to 145 MB
/// after a storm with 8 messages of 10 MB, each parsed and copied a few times.
const PEAK_RSS_BOUND_KB: u64 = 512 * 1024;
/// How long the answers may take after the last message was sent.
const ANSWER_WAIT: Duration = Duration::from_secs(120);
const TOKEN: &str = "fuzz-token-0123456789abcdef";
const PROTOCOL: &str = "2025-06-18";

fn message_count() -> usize {
    std::env::var("CODEBOX_FUZZ_MESSAGES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_MESSAGES)
}

fn initialize(id: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL, "capabilities": {},
        "clientInfo": {"name": "fuzz", "version": "1"}}})
}

/// What came back, by id.
#[derive(Default)]
struct Answers {
    /// Answers per id (canonical JSON text).
    by_id: HashMap<String, usize>,
    /// The answers themselves for the few ids a test looks into.
    kept: HashMap<String, Value>,
    /// Errors without an id (the request's id could not be read).
    anonymous_errors: usize,
    /// Results vs. errors, and tool results with `isError`.
    results: usize,
    errors: usize,
    tool_errors: usize,
    /// Anything else the server sent (notifications, requests) and lines that are not JSON.
    other: usize,
    not_json: usize,
}

impl Answers {
    fn record(&mut self, v: Value) {
        let Some(o) = v.as_object() else {
            self.not_json += 1;
            return;
        };
        let is_answer = o.contains_key("result") || o.contains_key("error");
        if !is_answer {
            self.other += 1;
            return;
        }
        if o.contains_key("error") {
            self.errors += 1;
        } else {
            self.results += 1;
            if o["result"]["isError"] == json!(true) {
                self.tool_errors += 1;
            }
        }
        match o.get("id").and_then(canonical_id) {
            Some(id) => {
                *self.by_id.entry(id.clone()).or_insert(0) += 1;
                if id.len() < 64 && id.contains("keep") {
                    self.kept.insert(id, v);
                }
            }
            None => self.anonymous_errors += 1,
        }
    }

    /// Ids owed but not (or not exactly as often) answered, and ids answered but never sent.
    fn mismatches(&self, owed: &HashMap<String, usize>) -> (Vec<String>, Vec<String>) {
        let short = |id: &String| id.chars().take(80).collect::<String>();
        let missing = owed
            .iter()
            .filter(|(id, n)| self.by_id.get(*id).copied().unwrap_or(0) != **n)
            .map(|(id, n)| {
                format!(
                    "{} (owed {n}, got {})",
                    short(id),
                    self.by_id.get(id).copied().unwrap_or(0)
                )
            })
            .collect();
        let unexpected = self
            .by_id
            .keys()
            .filter(|id| !owed.contains_key(*id))
            .map(short)
            .collect();
        (missing, unexpected)
    }
}

fn owed_counts<'a>(messages: impl Iterator<Item = &'a Message>) -> HashMap<String, usize> {
    let mut owed = HashMap::new();
    for m in messages {
        for id in &m.owed {
            *owed.entry(id.clone()).or_insert(0) += 1;
        }
    }
    owed
}

fn print_tally(transport: &str, messages: &[Message]) {
    let tally = fuzz_gen::tally(messages);
    let kinds: Vec<String> = tally.iter().map(|(k, n)| format!("{k:?} {n}")).collect();
    println!(
        "fuzz {transport}: {} messages ({}): {}",
        messages.len(),
        messages.iter().filter(|m| !m.owed.is_empty()).count(),
        kinds.join(", ")
    );
}

/// The stdio side of a raw client: every line the server writes, parsed, into `answers`.
fn read_stdout(
    stdout: tokio::process::ChildStdout,
    answers: Arc<Mutex<Answers>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut r = BufReader::with_capacity(1 << 16, stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let parsed = serde_json::from_slice::<Value>(&line);
            let mut a = answers.lock().unwrap();
            match parsed {
                Ok(v) => a.record(v),
                Err(_) => a.not_json += 1,
            }
        }
    })
}

async fn write_line(stdin: &mut tokio::process::ChildStdin, bytes: &[u8]) {
    stdin.write_all(bytes).await.expect("write to the server");
    stdin.write_all(b"\n").await.expect("write to the server");
}

/// Wait until every owed id is answered (or the time is up).
async fn await_answers(answers: &Mutex<Answers>, owed: &HashMap<String, usize>, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if answers.lock().unwrap().mismatches(owed).0.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn assert_all_answered(transport: &str, answers: &Answers, owed: &HashMap<String, usize>) {
    let (missing, unexpected) = answers.mismatches(owed);
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "{transport}: {} requests not answered exactly once, e.g. {:?}; {} answers to ids never sent, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)],
        unexpected.len(),
        &unexpected[..unexpected.len().min(10)],
    );
}

/// After the server stopped: nothing of its instance is left on the daemon.
async fn assert_no_leftovers(instance: &str) {
    let instance = instance.to_string();
    eventually(60, "the server's containers are all removed", || {
        instance_objects(&instance).is_empty()
    })
    .await;
}

fn assert_no_panics(server: &ServeChild) {
    let (panics, tail) = server.stderr_report();
    assert!(panics.is_empty(), "the server panicked: {panics:?}\n{tail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_survives_hostile_messages_answers_every_request_and_leaks_nothing() {
    let seed = fuzz_gen::seed();
    let n = message_count();
    println!("fuzz stdio: seed {seed:#x} (replay with CODEBOX_FUZZ_SEED={seed:#x})");
    let started = Instant::now();
    let mut gen = Generator::new(seed, MAX_RUNS, MAX_HUGE);
    let messages = gen.messages(n);
    print_tally("stdio", &messages);

    let mut server = ServeChild::start(Options::default()).await;
    let mut stdin = server.stdin.take().unwrap();
    let answers = Arc::new(Mutex::new(Answers::default()));
    let reader = read_stdout(server.stdout.take().unwrap(), answers.clone());

    // Before the handshake: garbage, a notification, a response, a request that is not
    // `initialize`, a ping. None of it may end the session.
    let before: Vec<Vec<u8>> = vec![
        b"\xff\xfe garbage".to_vec(),
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":"pre-1","result":{}}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":"pre-2","method":"tools/list"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":"pre-3","method":"ping"}"#.to_vec(),
        br#"{"jsonrpc":"2.0","id":"pre-4","method":"tools/call","params":"x"}"#.to_vec(),
        br#"[{"jsonrpc":"2.0","id":"pre-5","method":"ping"}]"#.to_vec(),
    ];
    let mut owed: HashMap<String, usize> = HashMap::new();
    for b in &before {
        for id in owed_list(b) {
            *owed.entry(id).or_insert(0) += 1;
        }
        write_line(&mut stdin, b).await;
    }
    write_line(
        &mut stdin,
        initialize(json!("init-keep")).to_string().as_bytes(),
    )
    .await;
    *owed.entry("\"init-keep\"".into()).or_insert(0) += 1;
    await_answers(&answers, &owed, Duration::from_secs(60)).await;
    assert!(server.alive(), "the server exited before the handshake");
    assert!(
        answers.lock().unwrap().kept.contains_key("\"init-keep\""),
        "no answer to initialize after hostile messages before it"
    );
    write_line(
        &mut stdin,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;

    // The storm.
    let storm = Instant::now();
    for m in &messages {
        write_line(&mut stdin, &m.bytes).await;
    }
    for (id, k) in owed_counts(messages.iter()) {
        *owed.entry(id).or_insert(0) += k;
    }
    let sent = storm.elapsed();
    await_answers(&answers, &owed, ANSWER_WAIT).await;
    let answered = storm.elapsed();
    assert!(server.alive(), "the server exited during the storm");
    assert_all_answered("stdio", &answers.lock().unwrap(), &owed);

    // A valid request still gets its answer.
    let check = json!({"jsonrpc": "2.0", "id": "check-keep", "method": "tools/call", "params": {
        "name": "run_code", "arguments": {"language": "python", "code": "print(6 * 7)"}}});
    write_line(&mut stdin, check.to_string().as_bytes()).await;
    *owed.entry("\"check-keep\"".into()).or_insert(0) += 1;
    await_answers(&answers, &owed, Duration::from_secs(120)).await;
    {
        let a = answers.lock().unwrap();
        let report = &a.kept["\"check-keep\""]["result"]["structuredContent"];
        assert_eq!(report["status"], "succeeded", "{report}");
        assert_eq!(report["stdout"], "42\n");
    }
    let peak_kb = server.peak_rss_kb();
    let instance = server.instance().await;

    // Requests the client sends right before it closes its end are still answered; a run
    // started then is stopped and removed.
    let last = [
        json!({"jsonrpc": "2.0", "id": "last-1", "method": "ping"}),
        json!({"jsonrpc": "2.0", "id": "last-2", "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": "last-3", "method": "tools/call", "params": {
            "name": "start_run", "arguments": {"language": "bash", "code": "sleep 600",
            "limits": {"timeout_seconds": 900}}}}),
        json!({"jsonrpc": "2.0", "id": "last-4", "method": "tools/call", "params": {
            "name": "get_result", "arguments": {"run_id": "nope"}}}),
        json!({"jsonrpc": "2.0", "id": "last-5", "method": "tools/call", "params": "x"}),
    ];
    for m in &last {
        write_line(&mut stdin, m.to_string().as_bytes()).await;
        *owed.entry(m["id"].to_string()).or_insert(0) += 1;
    }
    drop(stdin);
    let status = server.wait(Duration::from_secs(90)).await;
    reader.await.unwrap();
    assert!(status.success(), "codebox serve exited with {status}");
    assert_all_answered("stdio (after closing)", &answers.lock().unwrap(), &owed);
    assert_no_panics(&server);
    assert_no_leftovers(&instance).await;

    let a = answers.lock().unwrap();
    println!(
        "fuzz stdio: {} owed answers all came ({} results, {} of them tool errors; {} JSON-RPC errors, {} without an id); sent in {:.1} s, answered in {:.1} s, whole test {:.1} s; peak RSS {} MB (bound {} MB)",
        owed.values().sum::<usize>(),
        a.results,
        a.tool_errors,
        a.errors,
        a.anonymous_errors,
        sent.as_secs_f64(),
        answered.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        peak_kb / 1024,
        PEAK_RSS_BOUND_KB / 1024,
    );
    assert!(
        peak_kb < PEAK_RSS_BOUND_KB,
        "peak RSS {peak_kb} kB over the bound {PEAK_RSS_BOUND_KB} kB"
    );
}

fn owed_list(bytes: &[u8]) -> Vec<String> {
    owed(bytes)
}

#[tokio::test]
async fn stdio_client_that_stops_reading_leaves_the_server_alive_and_it_exits_cleanly_later() {
    let mut server = ServeChild::start(Options::default()).await;
    let mut stdin = server.stdin.take().unwrap();
    let mut stdout = BufReader::new(server.stdout.take().unwrap());
    write_line(&mut stdin, initialize(json!(1)).to_string().as_bytes()).await;
    let mut line = String::new();
    stdout.read_line(&mut line).await.unwrap();
    assert!(line.contains("\"id\":1"), "{line}");
    write_line(
        &mut stdin,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    )
    .await;
    let run = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "start_run", "arguments": {"language": "bash", "code": "sleep 600",
        "limits": {"timeout_seconds": 900}}}});
    write_line(&mut stdin, run.to_string().as_bytes()).await;
    line.clear();
    stdout.read_line(&mut line).await.unwrap();
    assert!(line.contains("run_id"), "{line}");
    let instance = server.instance().await;
    // The client stops reading: every answer from now on fails to be written.
    drop(stdout);
    for i in 0..200 {
        let ping = json!({"jsonrpc": "2.0", "id": 100 + i, "method": "tools/list"});
        write_line(&mut stdin, ping.to_string().as_bytes()).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        server.alive(),
        "the server exited when its answers could not be written"
    );
    // When stdin closes too it exits normally, with the run stopped and removed.
    drop(stdin);
    let status = server.wait(Duration::from_secs(90)).await;
    assert!(status.success(), "codebox serve exited with {status}");
    assert_no_panics(&server);
    assert_no_leftovers(&instance).await;
}

/// A raw HTTP client of one MCP session.
#[derive(Clone)]
struct HttpSession {
    http: reqwest::Client,
    url: String,
    session: String,
}

/// The JSON-RPC messages in a response body: an SSE stream's `data:` lines, or JSON.
fn rpc_messages(content_type: &str, body: &[u8]) -> Vec<Value> {
    if content_type.starts_with("text/event-stream") {
        String::from_utf8_lossy(body)
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .collect()
    } else {
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => items,
            Ok(v) => vec![v],
            Err(_) => Vec::new(),
        }
    }
}

impl HttpSession {
    async fn open(url: String) -> HttpSession {
        let http = reqwest::Client::new();
        let r = http
            .post(&url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(initialize(json!(1)).to_string())
            .send()
            .await
            .expect("initialize");
        assert_eq!(r.status(), 200);
        let session = r.headers()["mcp-session-id"].to_str().unwrap().to_string();
        let s = HttpSession { http, url, session };
        let (status, _) = s
            .post(
                br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#.to_vec(),
                &[],
            )
            .await;
        assert_eq!(status, 202);
        s
    }

    /// POST one body in the session; returns the status and the JSON-RPC messages that came
    /// back, reading until every `want`ed id is there or the body ends.
    async fn post(&self, body: Vec<u8>, want: &[String]) -> (u16, Vec<Value>) {
        let r = self
            .http
            .post(&self.url)
            .bearer_auth(TOKEN)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .header("mcp-session-id", &self.session)
            .header("mcp-protocol-version", PROTOCOL)
            .body(body)
            .send()
            .await
            .expect("the server answers every POST");
        let status = r.status().as_u16();
        let content_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mut r = r;
        let mut body = Vec::new();
        loop {
            match r.chunk().await {
                Ok(Some(c)) => body.extend_from_slice(&c),
                Ok(None) | Err(_) => break,
            }
            // An SSE stream may stay open after the answer: stop once it is complete.
            let got = rpc_messages(&content_type, &body);
            let ids: Vec<String> = got
                .iter()
                .filter_map(|m| m.get("id").and_then(canonical_id))
                .collect();
            if !want.is_empty() && want.iter().all(|w| ids.contains(w)) {
                break;
            }
        }
        (status, rpc_messages(&content_type, &body))
    }
}

/// HTTP-level hostility beside the MCP messages: each must get a response (or, for the
/// raw ones, leave the server unharmed). Returns how many were sent.
async fn http_hostilities(server: &ServeChild, s: &HttpSession) -> usize {
    let http = reqwest::Client::new();
    let url = server.http_url("/mcp");
    let ping = json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string();
    let sent = std::cell::Cell::new(0);
    let expect = |status: u16, want: &[u16], what: &str| {
        sent.set(sent.get() + 1);
        assert!(
            want.contains(&status),
            "{what}: status {status}, wanted {want:?}"
        );
    };
    let post = |auth: Option<&str>, headers: &[(&str, &str)], body: String| {
        let mut r = http
            .post(&url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(a) = auth {
            r = r.header("authorization", a);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send()
    };
    let bearer = format!("Bearer {TOKEN}");
    let session = [("mcp-session-id", s.session.as_str())];
    let r = post(None, &session, ping.clone()).await.unwrap();
    expect(r.status().as_u16(), &[401], "no token");
    let r = post(Some("Bearer wrong"), &session, ping.clone())
        .await
        .unwrap();
    expect(r.status().as_u16(), &[401], "wrong token");
    let r = post(
        Some(&format!("Bearer {TOKEN}\u{0}")),
        &session,
        ping.clone(),
    )
    .await;
    sent.set(sent.get() + 1);
    if let Ok(r) = r {
        assert_eq!(r.status(), 401, "a token with a NUL byte");
    }
    let r = post(
        Some(&bearer),
        &[("host", "evil.example.com"), session[0]],
        ping.clone(),
    )
    .await
    .unwrap();
    expect(r.status().as_u16(), &[403], "foreign Host");
    let r = post(Some(&bearer), &[], ping.clone()).await.unwrap();
    expect(r.status().as_u16(), &[400, 404, 422], "no session id");
    let r = post(
        Some(&bearer),
        &[("mcp-session-id", "no-such-session")],
        ping.clone(),
    )
    .await
    .unwrap();
    expect(r.status().as_u16(), &[404], "unknown session");
    let r = http
        .post(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "text/plain")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &s.session)
        .body(ping.clone())
        .send()
        .await
        .unwrap();
    expect(r.status().as_u16(), &[415], "text/plain body");
    let r = http
        .post(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("mcp-session-id", &s.session)
        .body(ping.clone())
        .send()
        .await
        .unwrap();
    expect(r.status().as_u16(), &[406], "no Accept");
    let big = format!("{{\"x\":\"{}\"}}", "A".repeat(17 * 1024 * 1024));
    // The server may answer and close before the client has sent it all; a client of its
    // own, so that no other request finds that connection in a pool.
    let big_request = reqwest::Client::new()
        .post(&url)
        .bearer_auth(TOKEN)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-session-id", &s.session)
        .body(big)
        .send()
        .await;
    match big_request {
        Ok(r) => expect(r.status().as_u16(), &[413], "a body over the cap"),
        Err(e) => {
            sent.set(sent.get() + 1);
            assert!(e.is_request() || e.is_body(), "a body over the cap: {e}");
        }
    }
    for method in [reqwest::Method::PUT, reqwest::Method::PATCH] {
        let r = http
            .request(method, &url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        expect(r.status().as_u16(), &[405], "PUT/PATCH");
    }
    let r = http
        .delete(&url)
        .bearer_auth(TOKEN)
        .header("mcp-session-id", "no-such-session")
        .send()
        .await
        .unwrap();
    // rmcp ends a session with 202, which codebox answers as 204 (the MCP Python SDK takes
    // only 200 and 204 as success).
    expect(
        r.status().as_u16(),
        &[204, 404],
        "DELETE of an unknown session",
    );
    let r = http.get(server.http_url("/metrics")).send().await.unwrap();
    expect(r.status().as_u16(), &[401], "metrics without the token");
    let r = http
        .get(server.http_url("/nope/../mcp"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    expect(r.status().as_u16(), &[400, 404, 405, 406], "a path trick");

    // Raw TCP: not HTTP at all, a body shorter than announced, a client that closes before
    // the answer (half or whole), a run_code whose client vanishes.
    let addr = server.addr.clone().unwrap();
    let raw = |bytes: Vec<u8>, read: bool, half_close: bool| {
        let addr = addr.clone();
        async move {
            let mut c = tokio::net::TcpStream::connect(&addr).await.unwrap();
            let _ = c.write_all(&bytes).await;
            if half_close {
                let _ = c.shutdown().await;
            }
            let mut out = Vec::new();
            if read {
                let _ =
                    tokio::time::timeout(Duration::from_secs(30), c.read_to_end(&mut out)).await;
            }
            out
        }
    };
    let request = |body: &str, length: usize| {
        format!(
            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nMcp-Session-Id: {}\r\nMcp-Protocol-Version: {PROTOCOL}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n{body}",
            s.session
        )
        .into_bytes()
    };
    let out = raw(b"GARBAGE \x00\xff\r\n\r\n".to_vec(), true, false).await;
    sent.set(sent.get() + 1);
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 400"),
        "{out:?}"
    );
    let out = raw(
        b"POST /mcp HTTP/1.1\r\nContent-Length: nope\r\n\r\n".to_vec(),
        true,
        false,
    )
    .await;
    sent.set(sent.get() + 1);
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 4"),
        "{out:?}"
    );
    raw(request("{\"jsonrpc\":", 1000), false, true).await;
    raw(request("", 50_000_000), false, false).await;
    sent.set(sent.get() + 2);
    let ping_id = json!({"jsonrpc": "2.0", "id": "half-closed", "method": "ping"}).to_string();
    let out = raw(request(&ping_id, ping_id.len()), true, true).await;
    sent.set(sent.get() + 1);
    assert!(
        String::from_utf8_lossy(&out).contains("half-closed"),
        "a client that closed its sending end still gets its answer: {}",
        String::from_utf8_lossy(&out)
    );
    // A run whose client goes away is stopped and removed (checked by the leftovers test at
    // the end); so is one whose request body never completes.
    let run = json!({"jsonrpc": "2.0", "id": "vanished", "method": "tools/call", "params": {
        "name": "run_code", "arguments": {"language": "bash", "code": "sleep 600",
        "limits": {"timeout_seconds": 900}}}})
    .to_string();
    raw(request(&run, run.len()), false, false).await;
    sent.set(sent.get() + 1);
    sent.get()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_survives_hostile_messages_answers_every_request_and_leaks_nothing() {
    let seed = fuzz_gen::seed() ^ 0x4854_5450; // "HTTP": other messages than stdio's
    let n = message_count();
    println!(
        "fuzz http: seed {seed:#x} (replay with CODEBOX_FUZZ_SEED={:#x})",
        fuzz_gen::seed()
    );
    let started = Instant::now();
    let mut gen = Generator::new(seed, MAX_RUNS, MAX_HUGE);
    let messages = gen.messages(n);
    print_tally("http", &messages);

    // A body cap above the 10 MB strings, so they reach the parser; one over it gets 413.
    let mut server = ServeChild::start(Options {
        http_token: Some(TOKEN),
        sets: &[
            "http.max_body_bytes=16777216",
            "sessions.max_upload_bytes=4194304",
        ],
        ..Options::default()
    })
    .await;
    let s = HttpSession::open(server.http_url("/mcp")).await;

    // /healthz, polled throughout.
    let polling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let health = {
        let (polling, url, http) = (polling.clone(), server.http_url("/healthz"), s.http.clone());
        tokio::spawn(async move {
            let (mut ok, mut failed) = (0, Vec::new());
            while polling.load(std::sync::atomic::Ordering::Relaxed) {
                match tokio::time::timeout(Duration::from_secs(10), http.get(&url).send()).await {
                    Ok(Ok(r)) if r.status() == 200 => ok += 1,
                    other => failed.push(format!("{other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            (ok, failed)
        })
    };

    let storm = Instant::now();
    let answers = Arc::new(Mutex::new(Answers::default()));
    let statuses = Arc::new(Mutex::new(BTreeMap::<u16, usize>::new()));
    let owed = owed_counts(messages.iter());
    let unanswered = Arc::new(Mutex::new(Vec::<String>::new()));
    futures_util::stream::iter(messages.iter())
        .map(|m| {
            let (s, answers, statuses) = (s.clone(), answers.clone(), statuses.clone());
            let unanswered = unanswered.clone();
            async move {
                let (status, got) = tokio::time::timeout(
                    Duration::from_secs(120),
                    s.post(m.bytes.clone(), &m.owed),
                )
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "no answer within 120 s to {}",
                        String::from_utf8_lossy(&m.bytes[..m.bytes.len().min(300)])
                    )
                });
                *statuses.lock().unwrap().entry(status).or_insert(0) += 1;
                let ids: Vec<String> = got
                    .iter()
                    .filter_map(|v| v.get("id").and_then(canonical_id))
                    .collect();
                if !m.owed.iter().all(|id| ids.contains(id)) {
                    unanswered.lock().unwrap().push(format!(
                        "HTTP {status} to {:?}: {}",
                        m.kind,
                        String::from_utf8_lossy(&m.bytes[..m.bytes.len().min(200)])
                    ));
                }
                let mut a = answers.lock().unwrap();
                for v in got {
                    a.record(v);
                }
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let answered = storm.elapsed();
    assert!(server.alive(), "the server exited during the storm");
    let unanswered = unanswered.lock().unwrap().clone();
    assert!(
        unanswered.is_empty(),
        "{} requests got no JSON-RPC answer with their id, e.g.:\n{}",
        unanswered.len(),
        unanswered[..unanswered.len().min(15)].join("\n")
    );
    assert_all_answered("http", &answers.lock().unwrap(), &owed);
    let hostile = http_hostilities(&server, &s).await;
    assert!(
        server.alive(),
        "the server exited after HTTP-level hostility"
    );

    // A valid request still gets its answer.
    let check = json!({"jsonrpc": "2.0", "id": "check", "method": "tools/call", "params": {
        "name": "run_code", "arguments": {"language": "python", "code": "print(6 * 7)"}}});
    let (status, got) = s
        .post(check.to_string().into_bytes(), &["\"check\"".to_string()])
        .await;
    assert_eq!(status, 200);
    let report = got
        .iter()
        .find(|m| m["id"] == "check")
        .map(|m| m["result"]["structuredContent"].clone())
        .expect("an answer to the check");
    assert_eq!(report["status"], "succeeded", "{report}");
    polling.store(false, std::sync::atomic::Ordering::Relaxed);
    let (health_ok, health_failed) = health.await.unwrap();
    assert!(
        health_failed.is_empty(),
        "/healthz failed: {health_failed:?}"
    );
    let peak_kb = server.peak_rss_kb();
    let instance = server.instance().await;
    let status = server.signal_and_wait(libc::SIGTERM).await;
    assert!(status.success(), "codebox serve exited with {status}");
    assert_no_panics(&server);
    assert_no_leftovers(&instance).await;

    let a = answers.lock().unwrap();
    println!(
        "fuzz http: {} owed answers all came ({} results, {} of them tool errors; {} JSON-RPC errors, {} without an id); HTTP statuses {:?}; {hostile} HTTP-level hostile requests; /healthz answered {health_ok} times; storm {:.1} s, whole test {:.1} s; peak RSS {} MB (bound {} MB)",
        owed.values().sum::<usize>(),
        a.results,
        a.tool_errors,
        a.errors,
        a.anonymous_errors,
        statuses.lock().unwrap(),
        answered.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        peak_kb / 1024,
        PEAK_RSS_BOUND_KB / 1024,
    );
    assert!(
        peak_kb < PEAK_RSS_BOUND_KB,
        "peak RSS {peak_kb} kB over the bound {PEAK_RSS_BOUND_KB} kB"
    );
}

/// One raw HTTP/1.1 exchange: the request as given (the target is not normalised), then the
/// status and body of the answer; `None` when the connection closed without an answer.
async fn raw_exchange(addr: &str, r: &fuzz_gen::ApiRequest) -> Option<(u16, Vec<u8>)> {
    let mut head = format!("{} {} HTTP/1.1\r\n", r.method, r.target);
    let given = |name: &str| r.headers.iter().any(|(k, _)| *k == name);
    if !given("host") {
        head.push_str("Host: 127.0.0.1\r\n");
    }
    if !given("authorization") && !given("x-auth-token") {
        head.push_str(&format!("Authorization: Bearer {TOKEN}\r\n"));
    }
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    let body = r.body.clone().unwrap_or_default();
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
    c.write_all(head.as_bytes()).await.ok()?;
    // A server refusing a body over the cap may answer and close before it is all sent.
    let _ = c.write_all(&body).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(120), c.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    let status: u16 = text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()?;
    let split = out.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let headers = text[..split].to_ascii_lowercase();
    let mut body = out[split..].to_vec();
    if headers.contains("transfer-encoding: chunked") {
        let mut plain = Vec::new();
        let mut rest = &body[..];
        while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..eol]).ok()?.trim(), 16).ok()?;
            if size == 0 || rest.len() < eol + 2 + size {
                break;
            }
            plain.extend_from_slice(&rest[eol + 2..eol + 2 + size]);
            rest = &rest[eol + 2 + size + 2..];
        }
        body = plain;
    }
    Some((status, body))
}

/// Whether a refusal's body has its API's shape and says something.
fn clear_refusal(api: fuzz_gen::Api, body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let text = |v: &Value| v.as_str().is_some_and(|s| !s.trim().is_empty());
    match api {
        fuzz_gen::Api::V1 => text(&v["error"]["code"]) && text(&v["error"]["message"]),
        fuzz_gen::Api::Piston => text(&v["message"]),
        // `{error}`, or the field errors of a 422 (`{field: [messages]}`), or a batch's
        // answers, one per submission.
        fuzz_gen::Api::Judge0 => {
            text(&v["error"])
                || v.as_object().is_some_and(|o| {
                    !o.is_empty()
                        && o.values().all(|m| {
                            m.as_array()
                                .is_some_and(|a| !a.is_empty() && a.iter().all(text))
                        })
                })
                || v.as_array().is_some_and(|a| !a.is_empty())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_apis_refuse_hostile_requests_with_clear_4xx_never_5xx_and_leak_nothing() {
    let seed = fuzz_gen::seed() ^ 0x4150_4953; // "APIS": other requests than the MCP storms
    let n = message_count() / 2;
    println!(
        "fuzz apis: seed {seed:#x} (replay with CODEBOX_FUZZ_SEED={:#x})",
        fuzz_gen::seed()
    );
    let started = Instant::now();
    const CAP: usize = 1024 * 1024;
    let requests = Generator::new(seed, 0, 0).api_requests(n, MAX_RUNS, MAX_HUGE, CAP);
    let mut server = ServeChild::start(Options {
        http_token: Some(TOKEN),
        sets: &[
            "http.max_body_bytes=1048576",
            "sessions.max_upload_bytes=524288",
        ],
        ..Options::default()
    })
    .await;
    let addr = server.addr.clone().unwrap();
    let tally = Arc::new(Mutex::new(BTreeMap::<(String, u16), usize>::new()));
    let wrong = Arc::new(Mutex::new(Vec::<String>::new()));
    futures_util::stream::iter(requests.iter())
        .map(|r| {
            let (addr, tally, wrong) = (addr.clone(), tally.clone(), wrong.clone());
            async move {
                let what = || {
                    let body = r.body.as_deref().unwrap_or_default();
                    format!(
                        "{:?} {} {} {:?}: {}",
                        r.api,
                        r.method,
                        r.target,
                        r.headers,
                        String::from_utf8_lossy(&body[..body.len().min(200)])
                    )
                };
                let Some((status, body)) = raw_exchange(&addr, r).await else {
                    wrong
                        .lock()
                        .unwrap()
                        .push(format!("no answer to {}", what()));
                    return;
                };
                *tally
                    .lock()
                    .unwrap()
                    .entry((format!("{:?}", r.api), status))
                    .or_insert(0) += 1;
                let fine = if status >= 500 {
                    false
                } else if (400..500).contains(&status) {
                    clear_refusal(r.api, &body)
                } else {
                    // Success only where a run may start, or a GET that reads.
                    r.runs || r.method == "GET"
                };
                if !fine {
                    wrong.lock().unwrap().push(format!(
                        "{status} {} to {}",
                        String::from_utf8_lossy(&body[..body.len().min(200)]),
                        what()
                    ));
                }
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<()>>()
        .await;
    let storm = started.elapsed();
    assert!(server.alive(), "the server exited during the storm");
    let wrong = wrong.lock().unwrap().clone();
    assert!(
        wrong.is_empty(),
        "{} requests were not refused clearly with a 4xx (or were dropped), e.g.:\n{}",
        wrong.len(),
        wrong[..wrong.len().min(15)].join("\n")
    );

    // Valid requests through each API still get their answers.
    let http = reqwest::Client::new();
    let v1: Value = http
        .post(server.http_url("/v1/runs"))
        .bearer_auth(TOKEN)
        .json(&json!({"language": "python", "code": "print(6 * 7)"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v1["stdout"], "42\n", "{v1}");
    let judge0: Value = http
        .post(server.http_url("/submissions?wait=true"))
        .header("x-auth-token", TOKEN)
        .json(&json!({"language_id": 71, "source_code": "print(6 * 7)", "expected_output": "42"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(judge0["status"]["id"], 3, "{judge0}");
    let piston: Value = http
        .post(server.http_url("/api/v2/execute"))
        .bearer_auth(TOKEN)
        .body(
            json!({"language": "python", "version": "*", "files": [{"content": "print(6 * 7)"}]})
                .to_string(),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(piston["run"]["stdout"], "42\n", "{piston}");
    let peak_kb = server.peak_rss_kb();
    let instance = server.instance().await;
    let status = server.signal_and_wait(libc::SIGTERM).await;
    assert!(status.success(), "codebox serve exited with {status}");
    assert_no_panics(&server);
    assert_no_leftovers(&instance).await;
    println!(
        "fuzz apis: {} requests, every one answered, refusals all 4xx in their API's shape; statuses by API {:?}; storm {:.1} s, whole test {:.1} s; peak RSS {} MB (bound {} MB)",
        requests.len(),
        tally.lock().unwrap(),
        storm.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        peak_kb / 1024,
        PEAK_RSS_BOUND_KB / 1024,
    );
    assert!(
        peak_kb < PEAK_RSS_BOUND_KB,
        "peak RSS {peak_kb} kB over the bound {PEAK_RSS_BOUND_KB} kB"
    );
}
