//! `codebox bench --url URL`: codebox servers already running, over HTTP (one server, or a
//! balancer in front of several, `scripts/cluster-bench.sh`): `n` runs of one program sent to
//! `POST /v1/runs` (which answers with the run's report) by `clients` clients, each sending
//! its next run as its last one is answered, after one run per client to warm up. Prints
//! runs/s and the latency each client saw.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use axum::http::{header, Request, Uri};
use bytes::Bytes;
use futures_util::future::join_all;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::stats::{ms, spread};

/// Longest wait for one run's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(300);

/// What to send, and where.
pub struct Remote {
    /// `POST /v1/runs` of the servers.
    pub endpoint: Uri,
    pub token: Option<String>,
    pub language: String,
    pub code: String,
    pub clients: usize,
    pub n: usize,
}

/// `/v1/runs` under `url` (`http://host:port`, with or without a path prefix).
pub fn runs_endpoint(url: &str) -> anyhow::Result<Uri> {
    let trimmed = url.trim_end_matches('/');
    let uri: Uri = format!("{trimmed}/v1/runs")
        .parse()
        .with_context(|| format!("--url {url} is not a URL"))?;
    if uri.scheme_str() != Some("http") || uri.host().is_none() {
        bail!("--url {url}: give http://HOST:PORT (plain HTTP; put the bench where it reaches the servers or their balancer without TLS)");
    }
    Ok(uri)
}

/// The bearer token for the servers: `--token-file` (`flag`), else `CODEBOX_TOKEN` (`env`),
/// else the `http.token_file` setting (`setting`) when that file exists, else none.
pub fn token(
    flag: Option<&Path>,
    env: Option<String>,
    setting: Option<&Path>,
) -> anyhow::Result<Option<String>> {
    let read = |path: &Path| -> anyhow::Result<String> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token file {}", path.display()))?;
        Ok(text.trim().to_string())
    };
    if let Some(path) = flag {
        return read(path).map(Some);
    }
    if let Some(t) = env.filter(|t| !t.trim().is_empty()) {
        return Ok(Some(t.trim().to_string()));
    }
    match setting.filter(|p| p.exists()) {
        Some(path) => read(path).map(Some),
        None => Ok(None),
    }
}

/// One answered run: latency (ms) and whether it succeeded, or what went wrong.
type Outcome = Result<f64, String>;

struct Sender {
    http: Client<HttpConnector, Full<Bytes>>,
    remote: Remote,
}

impl Sender {
    async fn send(&self, i: usize) -> Outcome {
        let r = &self.remote;
        let body = serde_json::json!({"language": r.language, "code": r.code}).to_string();
        let mut req =
            Request::post(r.endpoint.clone()).header(header::CONTENT_TYPE, "application/json");
        if let Some(t) = &r.token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        let req = req
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let t = Instant::now();
        let answered = async {
            let res = self.http.request(req).await.map_err(|e| e.to_string())?;
            let status = res.status();
            let bytes = res
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok::<_, String>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(ANSWER_WITHIN, answered)
            .await
            .map_err(|_| format!("run {i}: no answer within {} s", ANSWER_WITHIN.as_secs()))??;
        let latency = ms(t.elapsed());
        let report: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        if status.is_success() && report["status"] == "succeeded" {
            Ok(latency)
        } else {
            let text = String::from_utf8_lossy(&bytes);
            Err(format!(
                "run {i}: HTTP {status}: {}",
                text.chars().take(300).collect::<String>()
            ))
        }
    }
}

pub async fn bench(remote: Remote, out: &mut (dyn Write + Send)) -> anyhow::Result<i32> {
    let (clients, n) = (remote.clients.max(1), remote.n);
    writeln!(
        out,
        "{n} {} runs over POST {} from {clients} clients, after {clients} to warm up",
        remote.language, remote.endpoint
    )?;
    out.flush()?;
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    let sender = Sender {
        http: Client::builder(TokioExecutor::new()).build(http),
        remote,
    };
    // Warm: one run per client at once; a server that refuses (token, language) ends it here.
    let warm = join_all((0..clients).map(|i| sender.send(i))).await;
    if let Some(Err(e)) = warm.iter().find(|o| o.is_err()) {
        bail!("a warm-up run failed: {e}");
    }
    let next = AtomicUsize::new(0);
    let t = Instant::now();
    let outcomes: Vec<Outcome> = join_all((0..clients).map(|_| async {
        let mut mine = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return mine;
            }
            mine.push(sender.send(i).await);
        }
    }))
    .await
    .into_iter()
    .flatten()
    .collect();
    let took = t.elapsed();
    let latencies: Vec<f64> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .copied()
        .collect();
    let failed = outcomes.len() - latencies.len();
    let (min, median, p95) = spread(latencies);
    writeln!(
        out,
        "  {:.1} s, {:.2} runs/s; latency min {min:.0} ms, median {median:.0} ms, p95 {p95:.0} ms; \
         {failed} of {n} failed",
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64().max(f64::MIN_POSITIVE),
    )?;
    if let Some(Err(e)) = outcomes.iter().find(|o| o.is_err()) {
        writeln!(out, "  first failure: {e}")?;
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_comes_from_the_flag_then_the_variable_then_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let (flag, setting) = (dir.path().join("flag"), dir.path().join("setting"));
        std::fs::write(&flag, "from-flag\n").unwrap();
        std::fs::write(&setting, "from-setting\n").unwrap();
        let env = || Some("from-env".to_string());
        let got = |f: Option<&Path>, e: Option<String>, s: Option<&Path>| token(f, e, s).unwrap();
        assert_eq!(
            got(Some(&flag), env(), Some(&setting)).as_deref(),
            Some("from-flag")
        );
        assert_eq!(
            got(None, env(), Some(&setting)).as_deref(),
            Some("from-env")
        );
        assert_eq!(
            got(None, None, Some(&setting)).as_deref(),
            Some("from-setting")
        );
        // The setting's default file need not exist; a flag's must.
        assert_eq!(got(None, None, Some(&dir.path().join("none"))), None);
        assert!(token(Some(&dir.path().join("none")), None, None).is_err());
    }

    #[test]
    fn the_runs_route_is_found_under_the_url_given() {
        for (url, endpoint) in [
            ("http://127.0.0.1:8765", "http://127.0.0.1:8765/v1/runs"),
            ("http://127.0.0.1:8765/", "http://127.0.0.1:8765/v1/runs"),
            (
                "http://lb.internal/codebox/",
                "http://lb.internal/codebox/v1/runs",
            ),
        ] {
            assert_eq!(runs_endpoint(url).unwrap().to_string(), endpoint);
        }
        for url in ["https://lb.internal", "127.0.0.1:8765", "not a url"] {
            let err = runs_endpoint(url).unwrap_err().to_string();
            assert!(err.contains("--url"), "{url}: {err}");
        }
    }
}
