//! What `read_session_file` answers, whichever door asks (MCP, `GET /v1/sessions/{id}/files`).

use base64::Engine as _;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `omitted_reason` of a file whose bytes travel as a content block of the same result.
pub const SENT_AS_BLOCK: &str = "sent as a content block";

/// One entry of a folder's listing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct FolderEntry {
    pub path: String,
    /// `file`, `folder` or `link` (a link is never followed).
    pub kind: String,
    pub size_bytes: u64,
}

/// What `read_session_file` answers (beside the content block).
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct SessionFileResult {
    /// Relative to the working directory.
    pub path: String,
    /// A file's whole size; null for a folder.
    pub size_bytes: Option<u64>,
    pub mime_type: Option<String>,
    /// SHA-256 of the whole file, lowercase hex.
    pub sha256: Option<String>,
    /// The bytes read, base64; null when they travel as a content block (`omitted_reason`).
    pub content_base64: Option<String>,
    pub omitted_reason: Option<String>,
    /// Where the bytes read start, and how many there are.
    pub offset: Option<u64>,
    pub returned_bytes: Option<u64>,
    /// A folder's entries (one level, by name); null for a file.
    pub entries: Option<Vec<FolderEntry>>,
}

impl SessionFileResult {
    /// A folder's answer.
    pub fn folder(path: String, entries: Vec<FolderEntry>) -> SessionFileResult {
        SessionFileResult {
            path,
            size_bytes: None,
            mime_type: None,
            sha256: None,
            content_base64: None,
            omitted_reason: None,
            offset: None,
            returned_bytes: None,
            entries: Some(entries),
        }
    }

    /// A file's answer: the bytes read from `offset` in `content_base64`, or, when `sent` (they
    /// travel as a content block beside it), `omitted_reason` says so.
    pub fn file(read: FileRead<'_>, mime_type: &str, sent: bool) -> SessionFileResult {
        SessionFileResult {
            path: read.path.to_string(),
            size_bytes: Some(read.size_bytes),
            mime_type: Some(mime_type.to_string()),
            sha256: Some(read.sha256.to_string()),
            content_base64: (!sent)
                .then(|| base64::engine::general_purpose::STANDARD.encode(read.content)),
            omitted_reason: sent.then(|| SENT_AS_BLOCK.to_string()),
            offset: Some(read.offset),
            returned_bytes: Some(read.content.len() as u64),
            entries: None,
        }
    }
}

/// The bytes of a file that were read, and what is known of the whole file.
#[derive(Debug, Clone, Copy)]
pub struct FileRead<'a> {
    pub path: &'a str,
    /// The whole file's size and SHA-256.
    pub size_bytes: u64,
    pub sha256: &'a str,
    pub offset: u64,
    pub content: &'a [u8],
}
