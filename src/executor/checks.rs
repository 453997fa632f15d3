//! The checks a request's fields go through, each naming the field and the allowed range.

use std::path::{Component, Path};

use bytes::Bytes;

use super::request::{CompileLimitsInput, RequestError, MIN_TIMEOUT_SECONDS};
use crate::config::Config;
use crate::registry::{Language, Registry};
use crate::report::fmt_num;

pub(super) fn reject<T>(
    field: impl Into<String>,
    message: impl Into<String>,
) -> Result<T, RequestError> {
    Err(RequestError {
        field: field.into(),
        message: message.into(),
    })
}

/// Check one client-set limit: finite, positive, not over the ceiling. Never clamped.
pub(super) fn limit(
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

/// Check a path a client names inside a working directory (`.` is the directory itself);
/// returns it normalised.
pub fn check_relative_path(field: &str, path: &str) -> Result<String, RequestError> {
    if path == "." || path.is_empty() {
        return Ok(".".into());
    }
    check_path(field, path, "")
}

/// Check a workspace-relative file path.
pub(super) fn check_path(
    field: &str,
    path: &str,
    source_file: &str,
) -> Result<String, RequestError> {
    if path.is_empty() || path.len() > 255 {
        return reject(field, "must be a relative path of 1 to 255 bytes");
    }
    if path.contains('\0') || path.contains('\\') {
        return reject(field, format!("`{path}` contains a forbidden character"));
    }
    let p = Path::new(path);
    if p.is_absolute() {
        return reject(
            field,
            format!("`{path}` is absolute; use a path relative to the workspace"),
        );
    }
    for c in p.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return reject(
                    field,
                    format!("`{path}` contains `..`; paths must stay inside the workspace"),
                )
            }
            _ => return reject(field, format!("`{path}` must be a plain relative path")),
        }
    }
    let normal: Vec<&str> = p
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .map(|c| c.as_os_str().to_str().unwrap_or(""))
        .collect();
    if normal.is_empty() {
        return reject(field, format!("`{path}` names no file"));
    }
    let joined = normal.join("/");
    if joined == source_file || joined.starts_with(&format!("{source_file}/")) {
        return reject(
            field,
            format!("`{path}` clashes with the source file `{source_file}`"),
        );
    }
    Ok(joined)
}

/// Apply a caller's lower compile-stage limits: each at most the operator's, never above.
pub(super) fn lower_compile_limits(
    language: &mut Language,
    lower: CompileLimitsInput,
) -> Result<(), RequestError> {
    let l = &mut language.compile_limits;
    if let Some(t) = lower.timeout_seconds {
        if !(t.is_finite() && t >= MIN_TIMEOUT_SECONDS) {
            return reject(
                "compile_limits.timeout_seconds",
                format!("must be at least {MIN_TIMEOUT_SECONDS} s; requested {t}"),
            );
        }
        if t > l.timeout_seconds {
            return reject(
                "compile_limits.timeout_seconds",
                format!(
                    "requested {} s; the compile stage of {} may take at most {} s",
                    fmt_num(t),
                    language.id,
                    fmt_num(l.timeout_seconds)
                ),
            );
        }
        l.timeout_seconds = t;
    }
    if let Some(m) = lower.memory_mb {
        if m < 6 || m > l.memory_mb {
            return reject(
                "compile_limits.memory_mb",
                format!(
                    "requested {m} MB; the compile stage of {} may use 6 to {} MB",
                    language.id, l.memory_mb
                ),
            );
        }
        l.memory_mb = m;
        l.workspace_mb = l.workspace_mb.min(m / 2).max(1);
    }
    Ok(())
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
