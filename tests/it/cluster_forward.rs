//! A call forwarded to the server holding its run (SPEC sections 14 and 15), against a
//! stand-in owner on loopback: what it carries, and that it is given up once the owner's lease
//! lapses. The history is SQLite, written as another server would have: no PostgreSQL, no
//! Docker.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, Method};
use codebox::cluster::{Cluster, Peer};
use codebox::config::HttpSettings;
use codebox::engine::fake::FakeEngine;
use codebox::mcp::{answer_forwarded, ClusterServer, CodeboxServer};
use codebox::transport::http::{router, serve_connections, Token};
use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::mcp_support::{manager_on, temp_history, TOKEN};

const SECRET: &str = "0123456789abcdef";

/// A stand-in owner answering every request with its headers as a JSON object.
async fn echo_owner() -> Peer {
    let echo = |headers: HeaderMap| async move {
        let pairs = headers
            .iter()
            .map(|(k, v)| (k.to_string(), Value::from(v.to_str().unwrap_or(""))));
        axum::Json(Value::Object(pairs.collect()))
    };
    let app = axum::Router::new().fallback(echo);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Peer {
        instance: "owner".into(),
        url,
    }
}

#[tokio::test]
async fn a_forwarded_event_stream_resumes_at_the_clients_last_event_id() {
    let owner = echo_owner().await;
    let cluster = Cluster::new(SECRET, "me", Duration::from_secs(10));
    let mut client = HeaderMap::new();
    client.insert("accept", "text/event-stream".parse().unwrap());
    client.insert("last-event-id", "7".parse().unwrap());
    client.insert("authorization", "Bearer the-clients-token".parse().unwrap());
    let path = "/v1/runs/r1/events";
    let answer = cluster
        .send(&owner, Method::GET, path, &client, Default::default(), None)
        .await
        .unwrap();
    let body = axum::body::to_bytes(answer.into_body(), 1 << 20)
        .await
        .unwrap();
    let seen: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["last-event-id"], "7", "{seen}");
    assert_eq!(seen["accept"], "text/event-stream", "{seen}");
    assert!(
        seen.get("authorization").is_none(),
        "the client's token passed: {seen}"
    );
    assert_eq!(seen["x-codebox-cluster"], "0123456789abcdef");
}

/// A stand-in owner whose event streams send one event, then nothing: paused (SIGSTOP).
async fn paused_owner() -> String {
    let stream = || async {
        let first = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
            "id: 1\nevent: queued\ndata: {\"from\": \"owner\"}\n\n",
        )]);
        let events = first.chain(futures_util::stream::pending());
        (
            [("content-type", "text/event-stream")],
            axum::body::Body::from_stream(events),
        )
    };
    let app = axum::Router::new().fallback(stream);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[tokio::test]
async fn a_forwarded_event_stream_ends_once_the_owners_lease_lapses() {
    let owner = paused_owner().await;
    let (history, dir) = temp_history();
    let m = manager_on(Arc::new(FakeEngine::new()), |_| {}, Some(history.clone()));
    let lease = Duration::from_secs(1);
    let cluster = Arc::new(Cluster::new(SECRET, "me", lease));
    let server = CodeboxServer::new(codebox::sessions::Sessions::new(m));
    let server = ClusterServer::new(server, Some(cluster));
    let policy = HttpSettings::default();
    let stop = CancellationToken::new();
    let app = router(server, Some(Token::new(TOKEN)), &policy, stop.child_token());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let ct = stop.clone();
    tokio::spawn(serve_connections(listener, app, async move {
        ct.cancelled().await
    }));

    // Another server, "owner", runs the run and is alive.
    let _ = history.whereabouts("none").await; // the schema is in place
    let db = rusqlite::Connection::open(dir.path().join("history.sqlite3")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let run = uuid::Uuid::new_v4().simple().to_string();
    let now = codebox::history::now_ms();
    db.execute(
        "INSERT INTO instances (id, host, pid, started_at, heartbeat_at, advertise_url)
         VALUES ('owner', 'h', 1, ?1, ?1, ?2)",
        rusqlite::params![now, owner],
    )
    .unwrap();
    db.execute(
        "INSERT INTO runs (id, instance, created_at, language, memory_mb, timeout_seconds,
                           cpus, status, code_sha256, code_bytes)
         VALUES (?1, 'owner', ?2, 'python', 512, 10, 1, 'running', '', 0)",
        rusqlite::params![run, now],
    )
    .unwrap();
    let mut response = reqwest::Client::new()
        .get(format!("http://{addr}/v1/runs/{run}/events"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(first.ends_with(b"{\"from\": \"owner\"}\n\n"), "{first:?}");

    // Its heartbeat stops; the others settle what it held.
    db.execute(
        "UPDATE instances SET heartbeat_at = ?1 WHERE id = 'owner'",
        rusqlite::params![now - 60_000],
    )
    .unwrap();
    db.execute(
        "UPDATE runs SET status = 'sandbox_error' WHERE id = ?1",
        rusqlite::params![run],
    )
    .unwrap();
    let rest = async { while let Ok(Some(_)) = response.chunk().await {} };
    let ended = tokio::time::timeout(Duration::from_secs(10), rest).await;
    assert!(
        ended.is_ok(),
        "the stream from a lapsed owner goes on for ever"
    );
    stop.cancel();
}

#[tokio::test]
async fn an_unknown_id_costs_a_handful_of_lookups_before_a_forward() {
    let (history, _dir) = temp_history();
    let m = manager_on(Arc::new(FakeEngine::new()), |_| {}, Some(history.clone()));
    let cluster = Cluster::new(SECRET, "me", Duration::from_secs(3));
    let before = history.lookups();
    assert!(cluster.run_owner(&m, "r_unknown").await.is_none());
    let sessions = codebox::sessions::Sessions::new(m.clone());
    assert!(cluster
        .session_owner(&sessions, "s_unknown")
        .await
        .is_none());
    let lookups = history.lookups() - before;
    assert!(
        lookups <= 16,
        "{lookups} history lookups for two unknown ids"
    );
}

/// The text of a tool error.
fn error_text(result: &rmcp::model::CallToolResult) -> String {
    assert_eq!(result.is_error, Some(true), "{result:?}");
    crate::mcp_support::text(result)
}

#[tokio::test]
async fn a_forwarded_call_is_answered_here_as_the_tool_answers() {
    let fake = Arc::new(FakeEngine::new());
    let server = CodeboxServer::new(codebox::sessions::Sessions::new(
        crate::mcp_support::fake_manager(&fake, |_| {}),
    ));
    let answer = |tool: &'static str, args: Value| {
        answer_forwarded(&server, tool, args, CancellationToken::new(), None)
    };
    let bad_language = json!({"language": "intercal", "code": "x"});
    let text = error_text(&answer("run_code", bad_language).await);
    assert!(text.contains("language"), "{text}");
    let bad_type = json!({"run_id": 7});
    let text = error_text(&answer("get_result", bad_type).await);
    assert!(
        text.starts_with("failed to deserialize parameters: run_id"),
        "{text}"
    );
    let text = error_text(&answer("list_sessions", json!({})).await);
    assert!(
        text.contains("not a tool another server forwards"),
        "{text}"
    );
    let closed = answer("close_session", json!({"session_id": "s_unknown"})).await;
    assert!(error_text(&closed).contains("s_unknown"), "{closed:?}");
    assert!(fake.specs().is_empty(), "a refused call made a container");
}
