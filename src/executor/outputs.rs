//! Files the program left under `outputs/`: from what `codebox-init` sent to report entries,
//! with a media type.

use base64::Engine as _;

use crate::engine::protocol::{EntryKind, FileEntry};
use crate::report::FileReport;

/// The directory, relative to the working directory, whose files are returned.
const OUTPUTS_DIR: &str = "outputs";

/// The media type of a file: its first bytes for the formats a model may be shown, else its
/// extension.
pub fn mime_type(path: &str, content: &[u8]) -> &'static str {
    const MAGIC: &[(&[u8], &str)] = &[
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xff\xd8\xff", "image/jpeg"),
        (b"GIF87a", "image/gif"),
        (b"GIF89a", "image/gif"),
        (b"%PDF-", "application/pdf"),
        (b"PK\x03\x04", "application/zip"),
        (b"\x1f\x8b", "application/gzip"),
    ];
    for (magic, mime) in MAGIC {
        if content.starts_with(magic) {
            return mime;
        }
    }
    if content.len() >= 12 && &content[..4] == b"RIFF" && &content[8..12] == b"WEBP" {
        return "image/webp";
    }
    let ext = path
        .rsplit_once('.')
        .map(|(_, e)| e.to_ascii_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "pdf" => "application/pdf",
        "json" => "application/json",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "html" | "htm" => "text/html",
        "md" => "text/markdown",
        "xml" => "application/xml",
        "txt" | "log" | "py" | "c" | "cpp" | "h" | "rs" | "go" | "js" | "ts" | "java" | "rb"
        | "sh" | "toml" | "yaml" | "yml" | "ini" => "text/plain",
        "zip" => "application/zip",
        "gz" => "application/gzip",
        _ if std::str::from_utf8(content).is_ok() && !content.is_empty() => "text/plain",
        _ => "application/octet-stream",
    }
}

/// Whether a media type is an image an MCP client can show.
pub(crate) fn is_image(mime: &str) -> bool {
    matches!(
        mime,
        "image/png" | "image/jpeg" | "image/gif" | "image/webp"
    )
}

/// The media type of a folder entry: a folder under `outputs/` whose contents are not all
/// listed (`omitted_reason` says why).
const FOLDER_MIME: &str = "inode/directory";

/// Report entries for what was collected under `outputs/`. Folders appear only when something
/// in them is not listed (too deep, not readable, past the entry cap), with the reason.
pub(super) fn report_files(entries: &[FileEntry]) -> Vec<FileReport> {
    entries
        .iter()
        .filter_map(|e| {
            if e.kind == EntryKind::Dir {
                return e.reason.as_ref().map(|reason| FileReport {
                    path: e.path.clone(),
                    size_bytes: 0,
                    mime_type: FOLDER_MIME.to_string(),
                    sha256: String::new(),
                    content_base64: None,
                    omitted_reason: Some(reason.clone()),
                });
            }
            let sent = e.reason.is_none() && e.kind == EntryKind::File;
            Some(FileReport {
                path: e.path.clone(),
                size_bytes: e.size,
                mime_type: mime_type(&e.path, if sent { &e.content } else { &[] }).to_string(),
                sha256: e.sha256.clone(),
                content_base64: sent
                    .then(|| base64::engine::general_purpose::STANDARD.encode(&e.content)),
                omitted_reason: e.reason.clone(),
            })
        })
        .collect()
}

/// The report's message, with a clause naming the folders under `outputs/` that are not
/// fully listed (each with its reason), if any: files that are not listed must not vanish
/// without a word.
pub(super) fn with_unlisted_note(message: String, files: &[FileReport]) -> String {
    const NAMED: usize = 3;
    let folders: Vec<String> = files
        .iter()
        .filter(|f| f.mime_type == FOLDER_MIME)
        .map(|f| format!("{} ({})", f.path, f.omitted_reason.as_deref().unwrap_or("")))
        .collect();
    if folders.is_empty() {
        return message;
    }
    let more = match folders.len().saturating_sub(NAMED) {
        0 => String::new(),
        1 => " and 1 more folder (see files)".to_string(),
        n => format!(" and {n} more folders (see files)"),
    };
    format!(
        "{message}; not everything under {OUTPUTS_DIR}/ is listed: {}{more}",
        folders[..folders.len().min(NAMED)].join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_come_from_content_first_then_the_extension() {
        assert_eq!(mime_type("x.bin", b"\x89PNG\r\n\x1a\n...."), "image/png");
        assert_eq!(mime_type("plot.png", b""), "image/png");
        assert_eq!(mime_type("a.txt", b"\xff\xd8\xff\xe0"), "image/jpeg");
        assert_eq!(mime_type("w", b"RIFF\0\0\0\0WEBPVP8 "), "image/webp");
        assert_eq!(mime_type("data.csv", b"a,b\n"), "text/csv");
        assert_eq!(mime_type("notes", b"hello"), "text/plain");
        assert_eq!(
            mime_type("blob", b"\x00\x01\xfe"),
            "application/octet-stream"
        );
        assert!(is_image("image/webp") && !is_image("image/svg+xml"));
    }

    fn dir(path: &str, reason: Option<&str>) -> FileEntry {
        FileEntry {
            kind: EntryKind::Dir,
            path: path.into(),
            mode: 0o755,
            size: 0,
            sha256: String::new(),
            reason: reason.map(str::to_string),
            target: String::new(),
            content: Vec::new(),
        }
    }

    #[test]
    fn folders_not_fully_listed_are_reported_with_their_reason() {
        let files = report_files(&[
            dir("outputs/listed", None),
            dir("outputs/deep", Some("deeper than 16 levels")),
            dir("outputs", Some("500 more entries are not listed")),
        ]);
        assert_eq!(files.len(), 2, "{files:?}");
        let deep = &files[0];
        assert_eq!(
            (deep.path.as_str(), deep.size_bytes, deep.mime_type.as_str()),
            ("outputs/deep", 0, FOLDER_MIME)
        );
        assert_eq!((deep.sha256.as_str(), &deep.content_base64), ("", &None));
        assert_eq!(
            deep.omitted_reason.as_deref(),
            Some("deeper than 16 levels")
        );
        assert_eq!(
            with_unlisted_note("exited with code 0".into(), &files),
            "exited with code 0; not everything under outputs/ is listed: outputs/deep (deeper \
             than 16 levels), outputs (500 more entries are not listed)"
        );
        assert_eq!(with_unlisted_note("m".into(), &[]), "m");
    }
}
