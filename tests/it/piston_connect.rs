//! Piston's WebSocket `/api/v2/connect` on the fake engine, with a WebSocket client nobody
//! here wrote (tokio-tungstenite): whatever stdin the client sends while the program does not
//! read it, the run's end is still answered (`exit`, then close 4999), a `signal` is still
//! read, and a client that goes away still stops the run.

use std::sync::Arc;
use std::time::Duration;

use codebox::engine::fake::{Behaviour, FakeEngine, Step};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use crate::http_api::{start, Server, TOKEN};
use crate::mcp_support::fake_manager;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// More stdin messages than the server holds for a program (64).
const FLOOD: usize = 100;

/// A server whose first container (a C program's compile stage) acts out `compile`; its
/// start is slowed so that the whole flood has arrived before the stage begins.
async fn server(compile: Behaviour) -> (Arc<FakeEngine>, Server) {
    let fake = Arc::new(FakeEngine::new());
    fake.script(compile);
    fake.delay(Step::Start, Duration::from_millis(300));
    let s = start(fake_manager(&fake, |_| {}), Some(TOKEN)).await;
    (fake, s)
}

/// A C program started over the WebSocket, then `FLOOD` one-byte stdin messages.
async fn flooded(s: &Server) -> Socket {
    let url = s.url("/api/v2/connect").replace("http://", "ws://");
    let mut request = url.into_client_request().unwrap();
    let auth = format!("Bearer {TOKEN}").parse().unwrap();
    request.headers_mut().insert("authorization", auth);
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let init = json!({"type": "init", "language": "c", "files": [{"content": "int main( {"}]});
    send(&mut ws, init).await;
    for _ in 0..FLOOD {
        send(
            &mut ws,
            json!({"type": "data", "stream": "stdin", "data": "x"}),
        )
        .await;
    }
    ws
}

async fn send(ws: &mut Socket, message: Value) {
    ws.send(Message::text(message.to_string())).await.unwrap();
}

/// Every message up to the server's close, and the close code; fails after 20 s.
async fn until_closed(ws: &mut Socket) -> (Vec<Value>, Option<CloseCode>) {
    let read = async {
        let mut seen = Vec::new();
        while let Some(m) = ws.next().await {
            match m.unwrap() {
                Message::Text(t) => seen.push(serde_json::from_str(&t).unwrap()),
                Message::Close(frame) => return (seen, frame.map(|f| f.code)),
                _ => {}
            }
        }
        (seen, None)
    };
    tokio::time::timeout(Duration::from_secs(20), read)
        .await
        .expect("the server neither answered the run's end nor closed")
}

/// The messages' types, leaving out the program's output.
fn kinds(seen: &[Value]) -> Vec<&str> {
    let kinds = seen.iter().map(|m| m["type"].as_str().unwrap());
    kinds.filter(|k| *k != "data").collect()
}

/// Read until a message of type `kind`; fails after 20 s.
async fn until(ws: &mut Socket, kind: &str) {
    let read = async {
        while let Some(Ok(m)) = ws.next().await {
            let m: Value = serde_json::from_str(m.to_text().unwrap_or("{}")).unwrap_or_default();
            if m["type"] == kind {
                return;
            }
        }
        panic!("closed before a `{kind}` message");
    };
    let waited = tokio::time::timeout(Duration::from_secs(20), read).await;
    waited.unwrap_or_else(|_| panic!("no `{kind}` message"));
}

/// A gauge of `/metrics`.
async fn gauge(s: &Server, name: &str) -> u64 {
    let (_, text) = s.send("GET", "/metrics", None).await;
    let text = text.as_str().unwrap().to_string();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")));
    line.expect("the gauge").trim().parse().unwrap()
}

/// Within 10 s no run is active and no live reader connected.
async fn nothing_goes_on(s: &Server) {
    for _ in 0..200 {
        let (runs, readers) = (
            gauge(s, "codebox_active_runs").await,
            gauge(s, "codebox_live_readers").await,
        );
        if (runs, readers) == (0, 0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "still active: {} runs, {} live readers",
        gauge(s, "codebox_active_runs").await,
        gauge(s, "codebox_live_readers").await
    );
}

#[tokio::test]
async fn piston_connect_answers_exit_even_when_stdin_floods() {
    let compile_error = Behaviour::Exit {
        code: 1,
        stdout: String::new(),
        stderr: "main.c:1:11: error: expected declaration\n".into(),
    };
    let (_fake, s) = server(compile_error).await;
    let mut ws = flooded(&s).await;
    let (seen, close) = until_closed(&mut ws).await;
    assert_eq!(kinds(&seen), ["runtime", "stage", "exit"], "{seen:?}");
    let exit = seen.last().unwrap();
    assert_eq!(
        (&exit["stage"], &exit["code"]),
        (&json!("compile"), &json!(1))
    );
    assert_eq!(close, Some(CloseCode::Library(4999)));
    nothing_goes_on(&s).await;
}

#[tokio::test]
async fn piston_connect_reads_a_signal_behind_stdin_the_program_does_not_read() {
    let hang = Behaviour::Hang {
        stdout: String::new(),
    };
    let (_fake, s) = server(hang).await;
    let mut ws = flooded(&s).await;
    until(&mut ws, "stage").await;
    send(&mut ws, json!({"type": "signal", "signal": "SIGKILL"})).await;
    let (seen, close) = until_closed(&mut ws).await;
    assert_eq!(kinds(&seen), ["exit"], "{seen:?}");
    assert_eq!(close, Some(CloseCode::Library(4999)));
}

#[tokio::test]
async fn piston_connect_stops_the_run_of_a_client_gone_behind_unread_stdin() {
    let hang = Behaviour::Hang {
        stdout: String::new(),
    };
    let (_fake, s) = server(hang).await;
    let ws = flooded(&s).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // the compile stage runs
    drop(ws);
    nothing_goes_on(&s).await;
}
