//! The console's routes in-process, on the fake engine: the page and its assets with a strict
//! Content-Security-Policy and no token, the samples behind the token, the page's own origin
//! allowed on the APIs while every other `Origin` is refused, and `http.console = false`
//! (`--no-console`) removing all of it. The page itself is driven in a real browser by
//! `tests/console/run.sh`.

use std::sync::Arc;

use codebox::engine::fake::{exited, FakeEngine};
use reqwest::StatusCode;

use crate::http::{start, start_with};
use crate::mcp_support::fake_manager;

const TOKEN: &str = "console-token-0123456789abcdef";

fn manager() -> codebox::runs::RunManager {
    let fake = Arc::new(FakeEngine::new());
    fake.set_default(exited(0, "hi\n"));
    fake_manager(&fake, |_| {})
}

#[tokio::test]
async fn the_page_and_its_assets_come_without_a_token_under_a_strict_policy() {
    let s = start(manager(), Some(TOKEN)).await;
    let http = reqwest::Client::new();
    for (path, kind) in [
        ("/", "text/html"),
        ("/console/console.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let r = http
            .get(format!("http://{}{path}", s.addr))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers();
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        let csp = h["content-security-policy"].to_str().unwrap();
        for rule in [
            "default-src 'none'",
            "script-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(rule), "{path}: {csp}");
        }
        assert!(
            !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
            "{csp}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
    }
    let html = http
        .get(format!("http://{}/", s.addr))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "nothing from elsewhere"
    );
    assert!(!html.contains("<script>"), "no inline script");
    // The samples are data: behind the token.
    let url = format!("http://{}/console/samples.json", s.addr);
    assert_eq!(http.get(&url).send().await.unwrap().status(), 401);
    let samples: serde_json::Value = http
        .get(&url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(samples["python"]["code"]
        .as_str()
        .unwrap()
        .contains("print"));
}

#[tokio::test]
async fn the_pages_own_origin_may_use_the_api_and_no_other_origin_may() {
    let s = start(manager(), Some(TOKEN)).await;
    let http = reqwest::Client::new();
    let host = s.addr.to_string();
    let post = |origin: String, host: String| {
        http.post(format!("http://{}/v1/runs", s.addr))
            .bearer_auth(TOKEN)
            .header("origin", origin)
            .header("host", host)
            .header("content-type", "application/json")
            .body(r#"{"language": "python", "code": "print(1)"}"#)
            .send()
    };
    let own = post(format!("http://{host}"), host.clone()).await.unwrap();
    assert_eq!(own.status(), 200, "{:?}", own.text().await);
    for origin in [
        "http://evil.example".to_string(),
        "null".to_string(),
        format!("http://{host}.evil.example"),
        format!("https://evil.example/http://{host}"),
        // The right host on another port is another origin.
        format!("http://127.0.0.1:{}", s.addr.port().wrapping_add(1)),
    ] {
        let r = post(origin.clone(), host.clone()).await.unwrap();
        assert_eq!(r.status(), StatusCode::FORBIDDEN, "{origin}");
    }
    // A rebinding page names itself in Host as well as in Origin: the Host check refuses it.
    let r = post("http://evil.example".into(), "evil.example".into())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn no_console_removes_the_page_and_refuses_every_origin() {
    let s = start_with(manager(), Some(TOKEN), |h| h.console = false).await;
    let http = reqwest::Client::new();
    for path in ["/", "/console/console.js", "/console/samples.json"] {
        let r = http
            .get(format!("http://{}{path}", s.addr))
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404, "{path}");
    }
    let host = s.addr.to_string();
    let r = http
        .post(format!("http://{host}/v1/runs"))
        .bearer_auth(TOKEN)
        .header("origin", format!("http://{host}"))
        .header("content-type", "application/json")
        .body(r#"{"language": "python", "code": "print(1)"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
}
