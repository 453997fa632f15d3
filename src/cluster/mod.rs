//! Several servers as one (SPEC section 15): servers that share one PostgreSQL history find
//! which of them holds a run or a session, and forward a call about it to that server over
//! HTTP, authenticated by the cluster secret.
//!
//! Each server writes its `cluster.advertise_url` with its heartbeat (the history's
//! `instances` table); a server whose heartbeat is older than `cluster.lease_seconds` is gone
//! (the history marks what it held), and nothing is forwarded to it.
//!
//! # Security
//! The secret is kept only as its SHA-256 and compared in constant time, like the bearer
//! token. A request that carries it is another server's: it is never forwarded again (so two
//! servers that each think the other holds a run cannot bounce a call between them).

pub mod dispatch;
pub mod fence;
mod forward;

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap, HeaderValue, Method, Request};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::Config;
use crate::runs::{RunManager, UNKNOWN_GRACE};
use crate::sessions::Sessions;

use forward::{with_causes, PASSED};
pub(crate) use forward::{ForwardError, Forwarded};

/// The header that carries the cluster secret from one server to another.
const SECRET_HEADER: &str = "x-codebox-cluster";
/// The header naming the instance that forwarded a request (for the owner's logs).
const FORWARDED_BY_HEADER: &str = "x-codebox-forwarded-by";
/// The shortest secret accepted.
const MIN_SECRET_CHARS: usize = 16;
/// How often an id the history does not know is looked for again at first (the nap doubles
/// within [`UNKNOWN_GRACE`]: its server records a run or a session a moment after answering,
/// and a client behind a balancer may ask another server at once).
const FIRST_LOOK_AGAIN: Duration = Duration::from_millis(25);
/// Most session owners remembered (the list starts again when full).
const MAX_KNOWN_OWNERS: usize = 4096;

/// Why the cluster settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("this server shares its history (history.url is set) and serves HTTP, so it needs {missing}: {why}")]
    Missing { missing: String, why: &'static str },
    #[error("cannot read cluster.secret_file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cluster.secret_file {path}: its first line must hold at least {MIN_SECRET_CHARS} characters (e.g. `openssl rand -hex 32 > {path}`), the same file on every server")]
    Short { path: PathBuf },
}

/// What a call forwarded to another server is about.
#[derive(Debug, Clone, Copy)]
pub enum Held<'a> {
    Run(&'a str),
    Session(&'a str),
}

/// How often a server waiting on a forwarded call looks whether its owner still answers for
/// what it was asked about: this share of the lease, and no more often than
/// [`MIN_RECHECK`].
const RECHECKS_PER_LEASE: u32 = 3;
const MIN_RECHECK: Duration = Duration::from_millis(500);

/// Another server of the cluster that holds something asked about.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    pub instance: String,
    /// Its `cluster.advertise_url`, without a trailing `/`.
    pub url: String,
}

/// This server as a member of the cluster.
pub struct Cluster {
    /// The owners of sessions found lately (a session stays on its server for life): a
    /// session's every step need not ask the history. Forgotten when the owner does not
    /// answer.
    owners: std::sync::Mutex<std::collections::HashMap<String, Peer>>,
    digest: [u8; 32],
    secret: String,
    instance: String,
    lease: Duration,
    client: forward::HttpClient,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("instance", &self.instance)
            .field("lease", &self.lease)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// The cluster of a server with `--transport http`: `None` when its history is not shared
    /// (SQLite); an error naming what is missing when it is shared and `cluster.advertise_url`
    /// or `cluster.secret_file` is not set, or the secret is unreadable or short.
    pub(crate) fn for_http(
        config: &Config,
        instance: &str,
    ) -> Result<Option<Cluster>, ClusterError> {
        if config.history.url.is_none() {
            return Ok(None);
        }
        let c = &config.cluster;
        let missing = |missing: &str, why| ClusterError::Missing {
            missing: missing.to_string(),
            why,
        };
        let none = (c.advertise_url.is_none(), c.secret_file.is_none());
        let why = "the other servers forward calls about the runs and sessions it holds to it";
        match none {
            (true, true) => {
                return Err(missing(
                    "cluster.advertise_url and cluster.secret_file",
                    "set cluster.advertise_url to the URL the other servers reach it at (e.g. http://10.0.0.2:8765) and cluster.secret_file to a file holding the servers' shared secret",
                ))
            }
            (true, false) => return Err(missing("cluster.advertise_url (the URL the other servers reach it at, e.g. http://10.0.0.2:8765)", why)),
            (false, true) => return Err(missing("cluster.secret_file (a file holding the secret the servers present to each other, the same on every server)", why)),
            (false, false) => {}
        }
        let path = c.secret_file.as_deref().unwrap_or(Path::new(""));
        let secret = read_secret(path)?;
        Ok(Some(Cluster::new(&secret, instance, c.lease())))
    }

    /// A member with this secret (tests build one directly).
    pub fn new(secret: &str, instance: &str, lease: Duration) -> Cluster {
        Cluster {
            owners: Default::default(),
            digest: Sha256::digest(secret.trim().as_bytes()).into(),
            secret: secret.trim().to_string(),
            instance: instance.to_string(),
            lease,
            client: forward::client(),
        }
    }

    /// Whether a request comes from another server of the cluster (carries the secret).
    pub fn accepts(&self, headers: &HeaderMap) -> bool {
        let Some(value) = headers.get(SECRET_HEADER).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let presented: [u8; 32] = Sha256::digest(value.trim().as_bytes()).into();
        self.digest.ct_eq(&presented).into()
    }

    /// The server that holds run `run_id` unfinished, when it is another one that is alive
    /// and reachable; `None` when this server answers (it holds the run, the run ended, the
    /// history does not know it yet, or its server is gone).
    pub async fn run_owner(&self, manager: &RunManager, run_id: &str) -> Option<Peer> {
        if manager.holds_run(run_id) {
            return None;
        }
        let history = manager.history()?;
        let deadline = tokio::time::Instant::now() + UNKNOWN_GRACE;
        let mut nap = FIRST_LOOK_AGAIN;
        let w = loop {
            match history.whereabouts(run_id).await {
                Ok(Some(w)) => break w,
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    // Back off (doubling): an unknown id costs a handful of lookups.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tokio::time::sleep(nap.min(left)).await;
                    nap *= 2;
                    // This server may have accepted it meanwhile (a retried call).
                    if manager.holds_run(run_id) {
                        return None;
                    }
                }
                Ok(None) => return None,
                Err(e) => {
                    tracing::debug!(run_id, error = %e, "cannot find a run's server");
                    return None;
                }
            }
        };
        // Ended, or waiting in the shared queue (no server holds it yet): this server answers.
        if w.status.is_terminal() || w.unclaimed {
            return None;
        }
        self.peer(&w.instance, w.last_seen_ms_ago, w.advertise_url)
    }

    /// The server that holds session `session_id` open, when it is another one that is alive
    /// and reachable; `None` when this server answers.
    pub async fn session_owner(&self, sessions: &Sessions, session_id: &str) -> Option<Peer> {
        if sessions.knows(session_id) {
            return None;
        }
        if let Some(peer) = self.known_owner(session_id) {
            return Some(peer);
        }
        let history = sessions.runs().history()?;
        let deadline = tokio::time::Instant::now() + UNKNOWN_GRACE;
        let mut nap = FIRST_LOOK_AGAIN;
        let record = loop {
            match history.session(session_id).await {
                Ok(Some(r)) => break r,
                Ok(None) if tokio::time::Instant::now() < deadline => {
                    // Back off (doubling): an unknown id costs a handful of lookups.
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    tokio::time::sleep(nap.min(left)).await;
                    nap *= 2;
                    if sessions.knows(session_id) {
                        return None;
                    }
                }
                Ok(None) => return None,
                Err(e) => {
                    tracing::debug!(session_id, error = %e, "cannot find a session's server");
                    return None;
                }
            }
        };
        if record.ended.is_some() {
            return None;
        }
        let peer = self.peer(
            &record.instance,
            record.last_seen_ms_ago,
            record.advertise_url,
        )?;
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        if owners.len() >= MAX_KNOWN_OWNERS {
            owners.clear();
        }
        owners.insert(session_id.to_string(), peer.clone());
        Some(peer)
    }

    /// Resolves once `peer` can no longer answer for `what`: its lease lapsed and the other
    /// servers settled what it held (the run ended or went back to the shared queue, the
    /// session ended), or the run went to another server. A call forwarded to a server that
    /// was paused or cut off is then answered here, from the history, rather than waiting out
    /// its timeout (30 s and more) or, for `run_code` and `stop_run`, for ever. While the
    /// history cannot be read, it waits on.
    pub async fn released(&self, manager: &RunManager, peer: &Peer, what: Held<'_>) {
        let every = (self.lease / RECHECKS_PER_LEASE).max(MIN_RECHECK);
        loop {
            tokio::time::sleep(every).await;
            if self.settled_without(manager, peer, what).await {
                self.forget_owner(peer);
                tracing::info!(
                    owner = peer.instance,
                    about = ?what,
                    "a forwarded call is given up: its server's lease lapsed and what it held is settled; answering here"
                );
                return;
            }
        }
    }

    /// Whether what `peer` held has been settled without it (see [`Cluster::released`]).
    async fn settled_without(&self, manager: &RunManager, peer: &Peer, what: Held<'_>) -> bool {
        let Some(history) = manager.history() else {
            return false;
        };
        let lapsed = |seen: Option<i64>| seen.is_some_and(|ms| ms > self.lease.as_millis() as i64);
        match what {
            Held::Run(id) => match history.whereabouts(id).await {
                Ok(Some(w)) => {
                    w.instance != peer.instance
                        || (lapsed(w.last_seen_ms_ago) && (w.status.is_terminal() || w.unclaimed))
                }
                _ => false,
            },
            Held::Session(id) => match history.session(id).await {
                Ok(Some(r)) => lapsed(r.last_seen_ms_ago) && r.ended.is_some(),
                _ => false,
            },
        }
    }

    fn known_owner(&self, session_id: &str) -> Option<Peer> {
        let owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners.get(session_id).cloned()
    }

    /// `peer` did not answer: the sessions it was known to hold are looked up again.
    pub(crate) fn forget_owner(&self, peer: &Peer) {
        let mut owners = self.owners.lock().unwrap_or_else(|p| p.into_inner());
        owners.retain(|_, p| p != peer);
    }

    fn peer(&self, instance: &str, seen_ms_ago: Option<i64>, url: Option<String>) -> Option<Peer> {
        let alive = seen_ms_ago.is_some_and(|ms| ms <= self.lease.as_millis() as i64);
        if instance == self.instance || !alive {
            return None;
        }
        Some(Peer {
            instance: instance.to_string(),
            url: url?.trim_end_matches('/').to_string(),
        })
    }
}

/// Requests to another server of the cluster.
impl Cluster {
    /// Send `method path_and_query` with `body` (and the headers of `PASSED` from
    /// `headers`) to `peer`, within `timeout` if given; the answer as it comes.
    pub async fn send(
        &self,
        peer: &Peer,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
        timeout: Option<Duration>,
    ) -> Result<Response, ForwardError> {
        let unreachable = |detail: String| ForwardError::Unreachable {
            instance: peer.instance.clone(),
            url: peer.url.clone(),
            detail,
            lease_seconds: self.lease.as_secs(),
        };
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path_and_query}", peer.url));
        for name in PASSED {
            if let Some(v) = headers.get(&name) {
                request = request.header(name, v.clone());
            }
        }
        let request = request
            .header(
                SECRET_HEADER,
                HeaderValue::from_str(&self.secret).map_err(|e| unreachable(e.to_string()))?,
            )
            .header(FORWARDED_BY_HEADER, self.instance.as_str())
            .body(Full::new(body))
            .map_err(|e| unreachable(format!("cannot build the request: {e}")))?;
        let sent = self.client.request(request);
        let answer = match timeout {
            None => sent.await,
            Some(t) => match tokio::time::timeout(t, sent).await {
                Ok(a) => a,
                Err(_) => {
                    return Err(ForwardError::TimedOut {
                        instance: peer.instance.clone(),
                        url: peer.url.clone(),
                        seconds: t.as_secs_f64(),
                    })
                }
            },
        };
        let answer = answer.map_err(|e| {
            self.forget_owner(peer);
            unreachable(with_causes(&e))
        })?;
        Ok(answer.map(Body::new))
    }

    /// [`Cluster::send`] of a JSON body (or none), the JSON answer read whole.
    pub(crate) async fn call_json(
        &self,
        peer: &Peer,
        method: Method,
        path_and_query: &str,
        body: Option<&serde_json::Value>,
        timeout: Option<Duration>,
    ) -> Result<Forwarded, ForwardError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        let bytes = match body {
            Some(v) => {
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                Bytes::from(serde_json::to_vec(v).unwrap_or_default())
            }
            None => Bytes::new(),
        };
        let read = async {
            let response = self
                .send(peer, method, path_and_query, &headers, bytes, None)
                .await?;
            let status = response.status();
            let bytes = response
                .into_body()
                .collect()
                .await
                .map_err(|e| ForwardError::Unreachable {
                    instance: peer.instance.clone(),
                    url: peer.url.clone(),
                    detail: format!("its answer broke off: {e}"),
                    lease_seconds: self.lease.as_secs(),
                })?
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                serde_json::json!({"error": {"code": "bad_gateway", "message": String::from_utf8_lossy(&bytes)}})
            });
            Ok(Forwarded { status, body })
        };
        match timeout {
            None => read.await,
            Some(t) => tokio::time::timeout(t, read).await.unwrap_or_else(|_| {
                Err(ForwardError::TimedOut {
                    instance: peer.instance.clone(),
                    url: peer.url.clone(),
                    seconds: t.as_secs_f64(),
                })
            }),
        }
    }
}

/// How much longer than the wait itself a forwarded wait may take (the way there and back):
/// the time given to the owner beyond a forwarded `wait_seconds`, whoever forwards it (`/v1`,
/// an MCP tool, this module's own waits).
pub(crate) const WAIT_SLACK: Duration = Duration::from_secs(30);
/// How long a forwarded stop may take (the owner waits for the containers' removal).
const STOP_TIMEOUT: Duration = Duration::from_secs(150);

impl Cluster {
    /// A run's report from the server holding it, by `/v1/runs/{id}`: `None` when no other
    /// living server holds it, or it does not answer with a report.
    async fn report_from_owner(
        &self,
        manager: &RunManager,
        run_id: &str,
        method: axum::http::Method,
        query: &str,
        timeout: Duration,
    ) -> Option<crate::report::RunReport> {
        let peer = self.run_owner(manager, run_id).await?;
        let path = format!("/v1/runs/{run_id}{query}");
        let call = self.call_json(&peer, method, &path, None, Some(timeout));
        let answer = tokio::select! {
            a = call => a,
            _ = self.released(manager, &peer, Held::Run(run_id)) => return None,
        };
        match answer {
            Ok(f) if f.status.is_success() => serde_json::from_value(f.body).ok(),
            Ok(f) => {
                tracing::debug!(run_id, status = %f.status, "the server holding a run answered no report");
                None
            }
            Err(e) => {
                tracing::debug!(run_id, error = %e, "the server holding a run does not answer");
                None
            }
        }
    }

    /// Wait at most `timeout` at the server that holds `run_id` for its report (as it then
    /// stands); `None` when no other living server holds it or it does not answer.
    pub(crate) async fn wait_at_owner(
        &self,
        manager: &RunManager,
        run_id: &str,
        timeout: Duration,
    ) -> Option<crate::report::RunReport> {
        let secs = timeout
            .as_secs_f64()
            .min(crate::contract::params::MAX_WAIT_SECONDS);
        let query = format!("?wait_seconds={secs:.3}");
        self.report_from_owner(
            manager,
            run_id,
            axum::http::Method::GET,
            &query,
            timeout + WAIT_SLACK,
        )
        .await
    }

    /// Stop `run_id` at the server that holds it; `None` as for [`Cluster::wait_at_owner`].
    pub(crate) async fn stop_at_owner(
        &self,
        manager: &RunManager,
        run_id: &str,
    ) -> Option<crate::report::RunReport> {
        self.report_from_owner(
            manager,
            run_id,
            axum::http::Method::DELETE,
            "",
            STOP_TIMEOUT,
        )
        .await
    }
}

/// The first line of the secret file, checked.
fn read_secret(path: &Path) -> Result<String, ClusterError> {
    let text = std::fs::read_to_string(path).map_err(|source| ClusterError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let secret = text.lines().next().unwrap_or("").trim().to_string();
    if secret.chars().count() < MIN_SECRET_CHARS {
        return Err(ClusterError::Short {
            path: path.to_path_buf(),
        });
    }
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_same_secret_is_accepted() {
        let c = Cluster::new("0123456789abcdef", "me", Duration::from_secs(10));
        let mut h = HeaderMap::new();
        assert!(!c.accepts(&h));
        h.insert(SECRET_HEADER, "0123456789abcdeX".parse().unwrap());
        assert!(!c.accepts(&h));
        h.insert(SECRET_HEADER, "0123456789abcdef".parse().unwrap());
        assert!(c.accepts(&h));
    }

    #[test]
    fn a_peer_is_another_living_server_that_said_where_it_is() {
        let c = Cluster::new("0123456789abcdef", "me", Duration::from_secs(10));
        let url = || Some("http://10.0.0.2:8765/".to_string());
        assert_eq!(
            c.peer("other", Some(2_000), url()),
            Some(Peer {
                instance: "other".into(),
                url: "http://10.0.0.2:8765".into()
            })
        );
        assert_eq!(c.peer("me", Some(0), url()), None, "this server");
        assert_eq!(c.peer("other", Some(10_001), url()), None, "lease lapsed");
        assert_eq!(c.peer("other", None, url()), None, "never heard from");
        assert_eq!(c.peer("other", Some(0), None), None, "no advertise_url");
    }

    #[test]
    fn a_short_or_missing_secret_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short");
        std::fs::write(&short, "abc\n").unwrap();
        assert!(matches!(
            read_secret(&short),
            Err(ClusterError::Short { .. })
        ));
        assert!(matches!(
            read_secret(&dir.path().join("none")),
            Err(ClusterError::Read { .. })
        ));
        let good = dir.path().join("good");
        std::fs::write(&good, "  0123456789abcdef0123  \nignored\n").unwrap();
        assert_eq!(read_secret(&good).unwrap(), "0123456789abcdef0123");
    }
}
