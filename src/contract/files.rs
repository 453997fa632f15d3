//! The files a request places in a working directory (a run's or a session's), and the
//! checks of their paths, encodings and sizes.

use std::path::{Component, Path};

use base64::Engine as _;
use bytes::Bytes;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::checks::{reject, RequestError};
use crate::config::Config;

/// Encoding of a file's `content`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    #[default]
    Utf8,
    Base64,
}

/// An extra file placed in the workspace next to the source file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    /// Relative path inside the workspace (e.g. `data/input.csv`); no `..`, not absolute.
    pub path: String,
    /// File content, as text or base64.
    pub content: String,
    /// `utf8` (default) or `base64`.
    #[serde(default)]
    pub encoding: Option<Encoding>,
}

/// Whether a path someone else handed back (a container's artifact or output, a returned
/// file) stays inside the directory it is taken under: relative, at most 4096 bytes, no empty,
/// `.` or `..` component, no NUL. The one check for paths that do not come from a client.
pub fn stays_inside(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 4096
        && !path.starts_with('/')
        && path
            .split('/')
            .all(|c| !c.is_empty() && c != "." && c != ".." && !c.contains('\0'))
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
fn check_path(field: &str, path: &str, source_file: &str) -> Result<String, RequestError> {
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

/// Check a request's files: count, paths (none twice, none both a file and another's folder,
/// none clashing with `source_file`), encoding, and their total size within `max_total`.
pub(super) fn check_files(
    files: Option<Vec<FileInput>>,
    source_file: &str,
    max_total: usize,
    config: &Config,
) -> Result<Vec<(String, Bytes)>, RequestError> {
    let s = &config.sandbox;
    let raw_files = files.unwrap_or_default();
    if raw_files.len() > s.max_files {
        return reject(
            "files",
            format!(
                "has {} files; the maximum is {}",
                raw_files.len(),
                s.max_files
            ),
        );
    }
    let mut files: Vec<(String, Bytes)> = Vec::new();
    let mut total = 0usize;
    for (i, f) in raw_files.into_iter().enumerate() {
        let field = format!("files[{i}].path");
        let path = check_path(&field, &f.path, source_file)?;
        if files.iter().any(|(p, _)| *p == path) {
            return reject(field, format!("`{path}` appears twice"));
        }
        // A file may not be both a file and a directory of another file.
        if files
            .iter()
            .any(|(p, _)| p.starts_with(&format!("{path}/")) || path.starts_with(&format!("{p}/")))
        {
            return reject(
                field,
                format!("`{path}` clashes with another file's directory"),
            );
        }
        let content = match f.encoding.unwrap_or_default() {
            Encoding::Utf8 => f.content.into_bytes(),
            Encoding::Base64 => base64::engine::general_purpose::STANDARD
                .decode(f.content.trim())
                .map_err(|e| RequestError {
                    field: format!("files[{i}].content"),
                    message: format!("is not valid base64: {e}"),
                })?,
        };
        total += content.len();
        if total > max_total {
            return reject(
                "files",
                format!("total {total}+ bytes; the maximum is {max_total} bytes"),
            );
        }
        files.push((path, Bytes::from(content)));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_paths_inside_the_working_directory_stay_inside() {
        for good in ["a", "a/b", "build/main.o"] {
            assert!(stays_inside(good), "{good}");
        }
        for bad in ["", "/etc/passwd", "a/../b", "./a", "a//b", "..", "a/\0"] {
            assert!(!stays_inside(bad), "{bad:?}");
        }
    }
}
