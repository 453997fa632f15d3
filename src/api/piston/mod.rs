//! Piston v2 compatible routes: `GET /api/v2/runtimes`, `POST /api/v2/execute` and the
//! interactive WebSocket `GET /api/v2/connect` ([`connect`]), so a
//! program written for Piston (npm's `piston-client`, for one) runs unchanged against
//! codebox.
//!
//! As Piston: the request's `language` is a name or alias, `version` must match (absent or
//! `*`: any), the first of `files` is the program, times are milliseconds and memory bytes
//! (`-1` or `0`: the default), a value over the configured limit is refused with
//! `{message}` and status 400, and compile limits may only lower the operator's. Unlike
//! Piston, the body is read as JSON whatever its `Content-Type` (clients send `text/plain`),
//! `run` is absent after a compile error, and `output` is stdout then stderr (the streams
//! are captured apart, not interleaved).

pub mod connect;

use std::collections::BTreeMap;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use super::{parse_json, read_body, run_to_end, Api, BodyError, Client};
use crate::contract::{CompileLimitsInput, Encoding, FileInput, LimitsInput, RunRequest};
use crate::registry::Language;
use crate::report::{CompileReport, RunReport, Stage, Status};
use crate::runs::SubmitError;

/// Bytes in a MB as codebox counts memory limits.
const MB: f64 = 1024.0 * 1024.0;

/// A refusal in Piston's shape: `{message}`.
pub fn refusal(status: StatusCode, message: &str) -> Response {
    let mut r = (status, Json(serde_json::json!({ "message": message }))).into_response();
    match status {
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            r.headers_mut()
                .insert(header::RETRY_AFTER, super::v1::RETRY_AFTER_SECONDS.into());
        }
        StatusCode::PAYLOAD_TOO_LARGE => {
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        _ => {}
    }
    r
}

fn bad(message: impl AsRef<str>) -> Response {
    refusal(StatusCode::BAD_REQUEST, message.as_ref())
}

fn version_of<'a>(versions: &'a BTreeMap<String, String>, l: &Language) -> &'a str {
    versions.get(&l.id).map_or("0.0.0", String::as_str)
}

/// The routes, at `/api/v2`.
pub fn router(api: Api) -> Router {
    let routes = Router::new()
        .route("/runtimes", get(runtimes))
        .route("/execute", post(execute))
        .fallback(|| async {
            refusal(
                StatusCode::NOT_FOUND,
                "no such route; codebox serves Piston's GET /api/v2/runtimes and POST /api/v2/execute",
            )
        })
        .method_not_allowed_fallback(|| async {
            refusal(
                StatusCode::METHOD_NOT_ALLOWED,
                "this route does not take that method",
            )
        })
        .with_state(api);
    Router::new().nest("/api/v2", routes)
}

/// One entry of `/api/v2/runtimes`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Runtime {
    pub language: String,
    pub version: String,
    pub aliases: Vec<String>,
}

/// Every name of a language but its Piston name: its id, aliases and Piston aliases.
fn aliases(l: &Language) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for name in std::iter::once(&l.id)
        .chain(&l.aliases)
        .chain(&l.piston.aliases)
    {
        if *name != l.piston.language && !out.contains(name) {
            out.push(name.clone());
        }
    }
    out
}

async fn runtimes(State(api): State<Api>) -> Response {
    let versions = api.versions().await;
    let list: Vec<Runtime> = api
        .manager()
        .registry()
        .languages
        .values()
        .map(|l| Runtime {
            language: l.piston.language.clone(),
            version: versions.get(&l.id).cloned().unwrap_or_default(),
            aliases: aliases(l),
        })
        .collect();
    Json(list).into_response()
}

/// Whether a requested version matches a runtime's: `*` or nothing matches any; otherwise
/// each dotted part given must equal the runtime's (`3`, `3.11` and `3.11.2` match
/// `3.11.2`), `x` or `*` matching any part.
pub(crate) fn version_matches(requested: Option<&str>, actual: &str) -> bool {
    let Some(requested) = requested.map(str::trim).filter(|r| !r.is_empty()) else {
        return true;
    };
    let requested = requested
        .trim_start_matches('=')
        .trim_start_matches('v')
        .trim();
    if requested == "*" {
        return true;
    }
    let actual: Vec<&str> = actual.split('.').collect();
    let wanted: Vec<&str> = requested.split('.').collect();
    wanted.len() <= actual.len()
        && wanted
            .iter()
            .zip(&actual)
            .all(|(w, a)| matches!(*w, "x" | "X" | "*") || w == a)
}

/// A file of the request.
#[derive(Debug, Deserialize)]
struct PistonFile {
    #[serde(default)]
    name: Option<String>,
    content: String,
    #[serde(default)]
    encoding: Option<String>,
}

/// The request of `/api/v2/execute`. Fields Piston does not have are ignored, as Piston
/// ignores them.
#[derive(Debug, Deserialize)]
struct ExecuteRequest {
    language: String,
    #[serde(default)]
    version: Option<String>,
    files: Vec<PistonFile>,
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    args: Option<Vec<String>>,
    #[serde(default)]
    compile_timeout: Option<f64>,
    #[serde(default)]
    run_timeout: Option<f64>,
    #[serde(default)]
    compile_memory_limit: Option<f64>,
    #[serde(default)]
    run_memory_limit: Option<f64>,
    /// Piston's CPU-time limits: accepted and checked as numbers; codebox limits wall time.
    #[serde(default)]
    #[allow(dead_code)]
    compile_cpu_time: Option<f64>,
    #[serde(default)]
    #[allow(dead_code)]
    run_cpu_time: Option<f64>,
}

/// One client limit, checked as Piston checks it: absent or 0 (and -1 for memory) is the
/// default; negative or over `limit` is refused.
fn client_limit(
    name: &str,
    value: Option<f64>,
    limit: f64,
    minus_one_is_default: bool,
) -> Result<Option<f64>, String> {
    let Some(v) = value else { return Ok(None) };
    if !v.is_finite() {
        return Err(format!("If specified, {name} must be a number"));
    }
    if v == 0.0 || (minus_one_is_default && v == -1.0) {
        return Ok(None);
    }
    if v > limit {
        return Err(format!(
            "{name} cannot exceed the configured limit of {}",
            limit.floor() as u64
        ));
    }
    if v < 0.0 {
        return Err(format!("{name} must be non-negative"));
    }
    Ok(Some(v))
}

/// A file's content as codebox takes it.
fn decode_file(i: usize, f: &PistonFile) -> Result<(String, Encoding), String> {
    match f.encoding.as_deref().unwrap_or("utf8") {
        "utf8" => Ok((f.content.clone(), Encoding::Utf8)),
        "base64" => Ok((f.content.clone(), Encoding::Base64)),
        "hex" => {
            let text = f.content.trim();
            let bytes: Option<Vec<u8>> = text
                .len()
                .is_multiple_of(2)
                .then(|| {
                    (0..text.len())
                        .step_by(2)
                        .map(|k| u8::from_str_radix(text.get(k..k + 2)?, 16).ok())
                        .collect()
                })
                .flatten();
            match bytes {
                Some(b) => Ok((
                    base64::engine::general_purpose::STANDARD.encode(b),
                    Encoding::Base64,
                )),
                None => Err(format!("files[{i}].content is not valid hex")),
            }
        }
        other => Err(format!(
            "files[{i}].encoding must be utf8, base64 or hex; got `{other}`"
        )),
    }
}

/// The request as a codebox run.
fn to_run(api: &Api, req: ExecuteRequest, lang: &Language) -> Result<RunRequest, String> {
    let c = api.manager().config();
    let ceilings = c.ceilings();
    let memory_ceiling_mb = ceilings.memory_mb;
    let run_timeout = client_limit(
        "run_timeout",
        req.run_timeout,
        ceilings.timeout_seconds * 1000.0,
        false,
    )?;
    let run_memory = client_limit(
        "run_memory_limit",
        req.run_memory_limit,
        memory_ceiling_mb as f64 * MB,
        true,
    )?;
    let cl = lang.compile_limits;
    let compile_timeout = client_limit(
        "compile_timeout",
        req.compile_timeout,
        cl.timeout_seconds * 1000.0,
        false,
    )?;
    let compile_memory = client_limit(
        "compile_memory_limit",
        req.compile_memory_limit,
        cl.memory_mb as f64 * MB,
        true,
    )?;
    for (name, v) in [
        ("compile_cpu_time", req.compile_cpu_time),
        ("run_cpu_time", req.run_cpu_time),
    ] {
        if v.is_some_and(|v| !v.is_finite() || v < 0.0) {
            return Err(format!("{name} must be non-negative"));
        }
    }
    let mut files = req.files.iter().enumerate();
    let Some((_, program)) = files.next() else {
        return Err("files must include at least one utf8 encoded file".into());
    };
    let code = match decode_file(0, program)? {
        (text, Encoding::Utf8) => text,
        (b64, Encoding::Base64) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .map_err(|e| format!("files[0].content is not valid base64: {e}"))?;
            String::from_utf8(bytes).map_err(|_| "files[0] (the program) is not UTF-8 text")?
        }
    };
    let mut extra = Vec::new();
    for (i, f) in files {
        let (content, encoding) = decode_file(i, f)?;
        extra.push(FileInput {
            path: f.name.clone().unwrap_or_else(|| format!("file{i}.code")),
            content,
            encoding: Some(encoding),
        });
    }
    let compile_limits =
        (compile_timeout.is_some() || compile_memory.is_some()).then(|| CompileLimitsInput {
            timeout_seconds: compile_timeout.map(|ms| ms / 1000.0),
            memory_mb: compile_memory.map(|b| (b / MB).floor() as u64),
        });
    Ok(RunRequest {
        language: lang.id.clone(),
        code,
        stdin: req.stdin,
        args: req.args,
        files: (!extra.is_empty()).then_some(extra),
        limits: Some(LimitsInput {
            memory_mb: run_memory.map(|b| (b / MB).floor()),
            timeout_seconds: run_timeout.map(|ms| ms / 1000.0),
            cpus: None,
        }),
        compile_limits,
        ..RunRequest::default()
    })
}

/// A codebox field name as the Piston request names it.
fn piston_field(field: &str) -> String {
    let indexed = |rest: &str, suffix: &str| -> Option<String> {
        let (i, tail) = rest.split_once(']')?;
        let i: usize = i.parse().ok()?;
        Some(format!(
            "files[{}]{}",
            i + 1,
            tail.replace(".path", ".name") + suffix
        ))
    };
    match field {
        "code" => "files[0].content".into(),
        "limits.memory_mb" => "run_memory_limit".into(),
        "limits.timeout_seconds" => "run_timeout".into(),
        "compile_limits.timeout_seconds" => "compile_timeout".into(),
        "compile_limits.memory_mb" => "compile_memory_limit".into(),
        f => f
            .strip_prefix("files[")
            .and_then(|rest| indexed(rest, ""))
            .unwrap_or_else(|| f.to_string()),
    }
}

async fn execute(State(api): State<Api>, client: Client, body: Body) -> Response {
    let bytes = match read_body(body, api.max_body).await {
        Ok(b) => b,
        Err(e @ BodyError::TooLarge(_)) => {
            return refusal(StatusCode::PAYLOAD_TOO_LARGE, &e.message())
        }
        Err(e) => return bad(e.message()),
    };
    let req: ExecuteRequest = match parse_json(&bytes) {
        Ok(r) => r,
        Err(e) => return bad(e.message()),
    };
    let versions = api.versions().await;
    let registry = api.manager().registry().clone();
    let wanted = req.version.clone();
    let Some(lang) = registry
        .resolve_piston(&req.language)
        .filter(|l| version_matches(wanted.as_deref(), version_of(&versions, l)))
    else {
        return bad(format!(
            "{}-{} runtime is unknown",
            req.language,
            wanted.as_deref().unwrap_or("*")
        ));
    };
    let run = match to_run(&api, req, lang) {
        Ok(r) => r,
        Err(message) => return bad(message),
    };
    let m = api.manager();
    let accepted = match m.submit(run) {
        Ok(a) => a,
        Err(SubmitError::Invalid(e)) => {
            return bad(format!("{}: {}", piston_field(&e.field), e.message))
        }
        Err(e @ SubmitError::QueueFull { .. }) => {
            return refusal(StatusCode::TOO_MANY_REQUESTS, &e.to_string())
        }
        Err(e @ SubmitError::ShuttingDown) => {
            return refusal(StatusCode::SERVICE_UNAVAILABLE, &e.to_string())
        }
        // Piston's requests name no session.
        Err(e @ SubmitError::Session(_)) => return bad(e.to_string()),
    };
    match run_to_end(m, &accepted.run_id, &client).await {
        Ok(report) => Json(response(lang, version_of(&versions, lang), &report)).into_response(),
        Err(e) => refusal(StatusCode::NOT_FOUND, &e.to_string()),
    }
}

/// One stage of Piston's answer.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct StageResult {
    pub stdout: String,
    pub stderr: String,
    /// stdout, then stderr.
    pub output: String,
    pub code: Option<i64>,
    pub signal: Option<String>,
    pub message: Option<String>,
    /// Piston's (isolate's) status: `RE` non-zero exit, `SG` killed by a signal (out of
    /// memory too), `TO` timed out, `XX` internal error; null on success.
    pub status: Option<String>,
    /// Milliseconds.
    pub cpu_time: Option<u64>,
    pub wall_time: Option<u64>,
    /// Bytes.
    pub memory: Option<u64>,
}

/// Piston's answer, plus codebox's own status and run id.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct ExecuteResponse {
    pub language: String,
    pub version: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run: Option<StageResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub compile: Option<StageResult>,
    pub codebox_status: Status,
    pub run_id: String,
}

/// Piston's status and signal for how a stage ended.
fn status_and_signal(
    status: Status,
    signal: Option<&str>,
) -> (Option<&'static str>, Option<String>) {
    let killed = Some("SIGKILL".to_string());
    match status {
        Status::Succeeded | Status::Queued | Status::Running => (None, None),
        Status::Failed | Status::CompileError => match signal {
            Some(s) => (Some("SG"), Some(s.to_string())),
            None => (Some("RE"), None),
        },
        Status::TimedOut => (Some("TO"), killed),
        Status::OutOfMemory | Status::Stopped => (Some("SG"), killed),
        Status::SandboxError => (Some("XX"), None),
    }
}

fn compile_stage(c: &CompileReport, message: &str) -> StageResult {
    let (status, signal) = status_and_signal(c.status, None);
    StageResult {
        output: format!("{}{}", c.stdout, c.stderr),
        stdout: c.stdout.clone(),
        stderr: c.stderr.clone(),
        code: if signal.is_some() { None } else { c.exit_code },
        signal,
        message: status.map(|_| message.to_string()),
        status: status.map(str::to_string),
        cpu_time: c.usage.cpu_time_ms,
        wall_time: Some(c.duration_ms),
        memory: c.usage.peak_memory_kb.map(|kb| kb * 1024),
    }
}

/// A run report as Piston's answer.
pub(crate) fn response(lang: &Language, version: &str, r: &RunReport) -> ExecuteResponse {
    let compile_failed = r.stage == Some(Stage::Compile) && r.status != Status::Succeeded;
    let compile = r
        .compile
        .as_ref()
        .filter(|_| lang.is_compiled() || compile_failed)
        .map(|c| compile_stage(c, &r.message));
    let run = (!compile_failed).then(|| {
        let (status, signal) = status_and_signal(r.status, r.signal.as_deref());
        let compile_ms = r.compile.as_ref().map_or(0, |c| c.duration_ms);
        StageResult {
            output: format!("{}{}", r.stdout, r.stderr),
            stdout: r.stdout.clone(),
            stderr: r.stderr.clone(),
            code: if signal.is_some() { None } else { r.exit_code },
            signal,
            message: status.map(|_| r.message.clone()),
            status: status.map(str::to_string),
            cpu_time: r.usage.cpu_time_ms,
            wall_time: Some(r.duration_ms.saturating_sub(compile_ms)),
            memory: r.usage.peak_memory_kb.map(|kb| kb * 1024),
        }
    });
    ExecuteResponse {
        language: lang.piston.language.clone(),
        version: version.to_string(),
        run,
        compile,
        codebox_status: r.status,
        run_id: r.run_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_match_as_piston_clients_ask() {
        for (asked, ok) in [
            (None, true),
            (Some("*"), true),
            (Some(""), true),
            (Some("3"), true),
            (Some("3.11"), true),
            (Some("3.11.2"), true),
            (Some("3.x"), true),
            (Some("v3.11.2"), true),
            (Some("3.10"), false),
            (Some("3.11.2.1"), false),
            (Some("4"), false),
            (Some(">=3"), false),
        ] {
            assert_eq!(version_matches(asked, "3.11.2"), ok, "{asked:?}");
        }
    }

    #[test]
    fn client_limits_are_checked_as_piston_checks_them() {
        assert_eq!(client_limit("run_timeout", None, 3000.0, false), Ok(None));
        assert_eq!(
            client_limit("run_timeout", Some(0.0), 3000.0, false),
            Ok(None)
        );
        assert_eq!(
            client_limit("run_memory_limit", Some(-1.0), 1e9, true),
            Ok(None)
        );
        assert_eq!(
            client_limit("run_timeout", Some(3001.0), 3000.0, false),
            Err("run_timeout cannot exceed the configured limit of 3000".to_string())
        );
        assert_eq!(
            client_limit("run_timeout", Some(-1.0), 3000.0, false),
            Err("run_timeout must be non-negative".to_string())
        );
        assert_eq!(
            client_limit("run_timeout", Some(5.0), 3000.0, false),
            Ok(Some(5.0))
        );
    }

    #[test]
    fn codebox_fields_are_named_as_the_piston_request_names_them() {
        assert_eq!(piston_field("code"), "files[0].content");
        assert_eq!(piston_field("files[0].path"), "files[1].name");
        assert_eq!(piston_field("files[2].content"), "files[3].content");
        assert_eq!(piston_field("limits.memory_mb"), "run_memory_limit");
        assert_eq!(piston_field("args[1]"), "args[1]");
    }
}
