//! The checks a request's fields go through, each naming the field and the allowed range.

use bytes::Bytes;

use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::fmt_num;

/// A rejected request: which field, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct RequestError {
    pub field: String,
    pub message: String,
}

/// The shortest wall-clock limit a request may ask for. `codebox-init` counts whole
/// milliseconds and reads 0 as "no deadline", so a shorter limit would not be enforced (the
/// protocol fuzzer found that a 0.0004 s limit let a 3 s program finish).
pub(crate) const MIN_TIMEOUT_SECONDS: f64 = 0.001;

pub fn reject<T>(field: impl Into<String>, message: impl Into<String>) -> Result<T, RequestError> {
    Err(RequestError {
        field: field.into(),
        message: message.into(),
    })
}

/// Check one client-set limit: finite, positive, not over the ceiling. Never clamped.
pub fn limit(
    field: &str,
    requested: Option<f64>,
    default: f64,
    ceiling: f64,
    what: &str,
    unit: &str,
) -> Result<f64, RequestError> {
    let Some(v) = requested else {
        return Ok(default);
    };
    if !v.is_finite() {
        return reject(
            field,
            format!(
                "must be a finite number (at most {} {unit})",
                fmt_num(ceiling)
            ),
        );
    }
    if v <= 0.0 {
        return reject(
            field,
            format!(
                "must be positive; requested {}{unit_sep}{unit} (allowed: up to {} {unit})",
                fmt_num(v),
                fmt_num(ceiling),
                unit_sep = if unit.is_empty() { "" } else { " " }
            ),
        );
    }
    if v > ceiling {
        return reject(
            field,
            format!(
                "requested {} {unit} of {what}; the maximum is {} {unit}",
                fmt_num(v),
                fmt_num(ceiling)
            ),
        );
    }
    Ok(v)
}

/// The language a request names, or an error listing the supported ones.
pub(super) fn resolve_language<'r>(
    registry: &'r Registry,
    name: &str,
) -> Result<&'r Language, RequestError> {
    registry.resolve(name).ok_or_else(|| {
        let known: Vec<&str> = registry.languages.keys().map(String::as_str).collect();
        RequestError {
            field: "language".into(),
            message: if name.is_empty() {
                format!(
                    "is required (or give a session_id); supported: {}",
                    known.join(", ")
                )
            } else {
                format!("unknown language `{name}`; supported: {}", known.join(", "))
            },
        }
    })
}

/// Check one stdin: within the cap; empty is none.
pub(super) fn check_stdin(
    field: &str,
    stdin: Option<String>,
    config: &Config,
) -> Result<Option<Bytes>, RequestError> {
    let max = config.sandbox.max_stdin_bytes;
    match stdin {
        Some(text) if text.len() > max => reject(
            field,
            format!("is {} bytes; the maximum is {max} bytes", text.len()),
        ),
        Some(text) if !text.is_empty() => Ok(Some(Bytes::from(text.into_bytes()))),
        _ => Ok(None),
    }
}

/// Check one argument list: count and length caps, no NUL.
pub(super) fn check_args(
    field: &str,
    args: Option<Vec<String>>,
    config: &Config,
) -> Result<Vec<String>, RequestError> {
    let s = &config.sandbox;
    let args = args.unwrap_or_default();
    if args.len() > s.max_args {
        return reject(
            field,
            format!("has {} items; the maximum is {}", args.len(), s.max_args),
        );
    }
    for (i, a) in args.iter().enumerate() {
        if a.len() > s.max_arg_bytes || a.contains('\0') {
            return reject(
                format!("{field}[{i}]"),
                format!(
                    "must be at most {} bytes with no NUL character",
                    s.max_arg_bytes
                ),
            );
        }
    }
    Ok(args)
}
