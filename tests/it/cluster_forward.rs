//! What a call forwarded to the server holding its run carries (SPEC sections 14 and 15),
//! against a stand-in owner on loopback that answers with the headers it was sent: no
//! PostgreSQL, no Docker.

use std::time::Duration;

use axum::http::{HeaderMap, Method};
use codebox::cluster::{Cluster, Peer};
use serde_json::Value;

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
    let cluster = Cluster::new("0123456789abcdef", "me", Duration::from_secs(10));
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
