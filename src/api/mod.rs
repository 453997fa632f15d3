//! HTTP APIs for programs that are not MCP clients, served by the HTTP transport beside
//! `/mcp` on the same run manager (admission, queue, history and metrics are shared: a run is
//! a run whichever door it came in by):
//! - [`v1`]: codebox's own JSON API, with its sessions and its OpenAPI document;
//! - [`piston`]: Piston v2's `/api/v2/runtimes` and `/api/v2/execute`;
//! - [`judge0`]: the Judge0 CE 1.13.1 routes its clients use.
//!
//! The transport puts its bearer-token, Host and Origin checks in front of all three; each
//! module shapes its own refusals the way its clients expect.

pub mod client;
pub mod judge0;
pub mod piston;
pub mod v1;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use serde::de::DeserializeOwned;

pub use client::{Client, Peer, PeerHandle};

use crate::catalog::catalog;
use crate::registry::Language;
use crate::report::RunReport;
use crate::runs::{LookupError, RunManager};
use crate::sessions::Sessions;

/// How long the toolchain versions read from the images are reused.
const VERSIONS_TTL: Duration = Duration::from_secs(30);

/// What the three APIs share: the run manager and the sessions, the body cap, the Judge0
/// submissions and the toolchain versions.
#[derive(Clone)]
pub struct Api {
    manager: RunManager,
    sessions: Arc<Sessions>,
    max_body: usize,
    judge0: Arc<judge0::Store>,
    versions: Arc<Mutex<Option<(Instant, Versions)>>>,
}

/// Each language's toolchain version, by language id.
type Versions = Arc<BTreeMap<String, String>>;

impl Api {
    /// `max_body`: the largest request body read, in bytes (`http.max_body_bytes`).
    pub fn new(sessions: Arc<Sessions>, max_body: usize) -> Api {
        let manager = sessions.runs().clone();
        let retention = Duration::from_secs(manager.config().runs.result_retention_seconds);
        Api {
            manager,
            sessions,
            max_body,
            judge0: Arc::new(judge0::Store::new(retention)),
            versions: Arc::default(),
        }
    }

    pub fn manager(&self) -> &RunManager {
        &self.manager
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    /// Each language's toolchain version as a dotted number (`3.11.2`): from the version
    /// its image recorded when it was built, else from the image tag, else `0.0.0`.
    pub async fn versions(&self) -> Versions {
        if let Some((at, v)) = &*self.versions.lock().unwrap_or_else(|p| p.into_inner()) {
            if at.elapsed() < VERSIONS_TTL {
                return v.clone();
            }
        }
        let m = &self.manager;
        let labels: BTreeMap<String, Option<String>> =
            match catalog(m.executor().engine().as_ref(), m.registry(), m.config()).await {
                Ok(c) => c
                    .languages
                    .into_iter()
                    .map(|l| (l.language, l.version))
                    .collect(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the toolchain versions of the images");
                    BTreeMap::new()
                }
            };
        let versions: BTreeMap<String, String> = m
            .registry()
            .languages
            .values()
            .map(|l| {
                let label = labels.get(&l.id).cloned().flatten();
                (l.id.clone(), dotted_version(label.as_deref(), l))
            })
            .collect();
        let versions = Arc::new(versions);
        *self.versions.lock().unwrap_or_else(|p| p.into_inner()) =
            Some((Instant::now(), versions.clone()));
        versions
    }
}

/// The first dotted number in a version line (`g++ (Debian 12.2.0-14) 12.2.0` gives
/// `12.2.0`), padded to three parts; else the image tag's (`codebox/go:1.19` gives
/// `1.19.0`); else `0.0.0`.
fn dotted_version(label: Option<&str>, language: &Language) -> String {
    let tag = language.image.tag.rsplit(':').next();
    let found = label
        .and_then(first_dotted_number)
        .or_else(|| tag.and_then(first_dotted_number))
        .unwrap_or_else(|| "0".to_string());
    let mut parts: Vec<&str> = found.split('.').collect();
    while parts.len() < 3 {
        parts.push("0");
    }
    parts.join(".")
}

/// The first run of digits and dots that starts and ends with a digit and has a dot
/// (`v8.7` gives `8.7`), else the first number.
fn first_dotted_number(text: &str) -> Option<String> {
    let runs: Vec<&str> = text
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|r| r.trim_matches('.'))
        .filter(|r| !r.is_empty() && r.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    runs.iter()
        .find(|r| r.contains('.'))
        .or(runs.first())
        .map(|r| {
            // `1.2..3` is not a version: keep the part before the empty component.
            r.split("..").next().unwrap_or(r).to_string()
        })
}

/// Why a request body could not be read as the JSON an API expects.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyError {
    /// Over `http.max_body_bytes` (the rest is not read: the connection closes).
    TooLarge(usize),
    /// The connection failed while the body was being read.
    Unreadable,
    /// Not JSON, or not the JSON expected; `field` names the offending field when one does.
    Invalid {
        field: Option<String>,
        message: String,
    },
}

impl BodyError {
    pub fn message(&self) -> String {
        match self {
            BodyError::TooLarge(max) => format!("the request body exceeds {max} bytes"),
            BodyError::Unreadable => "the request body could not be read".to_string(),
            BodyError::Invalid { field, message } => match field {
                Some(f) => format!("{f}: {message}"),
                None => message.clone(),
            },
        }
    }
}

/// Read a whole body, at most `max` bytes.
pub(crate) async fn read_body(body: Body, max: usize) -> Result<Bytes, BodyError> {
    axum::body::to_bytes(body, max).await.map_err(|e| {
        let too_large = e
            .into_inner()
            .downcast_ref::<http_body_util::LengthLimitError>()
            .is_some();
        if too_large {
            BodyError::TooLarge(max)
        } else {
            BodyError::Unreadable
        }
    })
}

/// Parse JSON bytes as `T`; an error names the field it is about (`limits.memory_mb`), as
/// far as serde says.
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BodyError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| BodyError::Invalid {
            field: None,
            message: format!("the body is not JSON: {e}"),
        })?;
    from_value(value)
}

/// `parse_json` for a value already parsed.
pub fn from_value<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, BodyError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let field = if path.is_empty() || path == "." {
            named_field(&message)
        } else {
            Some(path)
        };
        BodyError::Invalid { field, message }
    })
}

/// The field a serde message names: "missing field `code`", "unknown field `x`, expected ...".
fn named_field(message: &str) -> Option<String> {
    for marker in ["missing field `", "unknown field `"] {
        if let Some(rest) = message.split(marker).nth(1) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    None
}

/// The `name=value` pairs of a query string, decoded.
pub(crate) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Stops a run when dropped armed: a request that waits for its run's end and whose client
/// goes away (the handler's future is dropped) stops the run, as an MCP cancellation does.
struct StopOnDrop {
    manager: RunManager,
    run_id: Option<String>,
}

impl StopOnDrop {
    pub fn new(manager: &RunManager, run_id: &str) -> StopOnDrop {
        StopOnDrop {
            manager: manager.clone(),
            run_id: Some(run_id.to_string()),
        }
    }

    /// The run ended (or is meant to go on): nothing to stop.
    fn disarm(mut self) {
        self.run_id = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        let Some(run_id) = self.run_id.take() else {
            return;
        };
        let manager = self.manager.clone();
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tracing::info!(
                run_id,
                "the HTTP client went away before its run ended; stopping the run"
            );
            handle.spawn(async move {
                let _ = manager.stop(&run_id).await;
            });
        }
    }
}

/// Wait for a run's end, however long it takes (its own limits bound it), and stop it if
/// the client goes away first: seen on its connection ([`Client::gone`]), or when hyper
/// drops the handler.
pub(crate) async fn run_to_end(
    manager: &RunManager,
    run_id: &str,
    client: &Client,
) -> Result<RunReport, LookupError> {
    let guard = StopOnDrop::new(manager, run_id);
    tokio::select! {
        report = manager.wait_end(run_id) => {
            guard.disarm();
            report
        }
        () = client.gone() => {
            guard.disarm();
            tracing::info!(run_id, "the HTTP client went away before its run ended; stopping the run");
            manager.stop(run_id).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_dotted_number_is_the_version() {
        for (text, want) in [
            ("g++ (Debian 12.2.0-14+deb12u1) 12.2.0", Some("12.2.0")),
            ("Welcome to Racket v8.7 [cs].", Some("8.7")),
            ("SBCL 2.2.9.debian", Some("2.2.9")),
            ("javac 17.0.19", Some("17.0.19")),
            ("Erlang/OTP 25", Some("25")),
            ("bookworm", None),
            ("1.2..3", Some("1.2")),
        ] {
            assert_eq!(first_dotted_number(text).as_deref(), want, "{text}");
        }
    }

    #[test]
    fn serde_messages_name_their_field() {
        let e =
            parse_json::<crate::contract::RunRequest>(br#"{"language": "python"}"#).unwrap_err();
        assert!(
            matches!(&e, BodyError::Invalid { field: Some(f), .. } if f == "code"),
            "{e:?}"
        );
        let e = parse_json::<crate::contract::RunRequest>(
            br#"{"language": "python", "code": "x", "limits": {"memory_mb": "a lot"}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&e, BodyError::Invalid { field: Some(f), .. } if f == "limits.memory_mb"),
            "{e:?}"
        );
        let e = parse_json::<crate::contract::RunRequest>(b"{").unwrap_err();
        assert!(
            matches!(&e, BodyError::Invalid { field: None, .. }),
            "{e:?}"
        );
    }
}
