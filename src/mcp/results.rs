//! Tool results: a run report with its files as content blocks (each file's bytes travel
//! once), and a session's file or folder.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use schemars::JsonSchema;
use serde::Serialize;

use crate::executor::outputs;
use crate::report::RunReport;
use crate::runs::sessions::{FolderEntry, SessionFile};

/// `omitted_reason` of a file whose bytes travel as a content block of the same result.
pub const SENT_AS_BLOCK: &str = "sent as a content block";

/// A run report as a tool result. Each file's bytes travel once: a returned image is an image
/// block, any other returned file an embedded resource whose URI ends with its path, in the
/// order of the report's `files`; in the report itself (structured content, and the same JSON
/// as text) those files have `content_base64: null` and `omitted_reason: "sent as a content
/// block"`. `codebox run --json` and the history get the report from the run manager, not from
/// here.
pub fn report_result(mut report: RunReport) -> CallToolResult {
    let mut blocks = Vec::new();
    for f in &mut report.files {
        let Some(data) = f.content_base64.take() else {
            continue;
        };
        f.omitted_reason = Some(SENT_AS_BLOCK.to_string());
        if outputs::is_image(&f.mime_type) {
            blocks.push(ContentBlock::image(data, f.mime_type.clone()));
            continue;
        }
        let uri = format!("codebox://runs/{}/{}", report.run_id, f.path);
        blocks.push(resource(uri, &f.mime_type, data));
    }
    let text = serde_json::to_string(&report).unwrap_or_default();
    let structured = serde_json::to_value(&report).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.extend(blocks);
    let mut result = CallToolResult::success(content);
    result.structured_content = Some(structured);
    result
}

/// An embedded resource: text when the bytes are UTF-8, else a blob.
fn resource(uri: String, mime_type: &str, base64_data: String) -> ContentBlock {
    let text = base64::engine::general_purpose::STANDARD
        .decode(&base64_data)
        .ok()
        .and_then(|b| String::from_utf8(b).ok());
    ContentBlock::resource(match text {
        Some(text) => ResourceContents::TextResourceContents {
            uri,
            mime_type: Some(mime_type.to_string()),
            text,
            meta: None,
        },
        None => ResourceContents::BlobResourceContents {
            uri,
            mime_type: Some(mime_type.to_string()),
            blob: base64_data,
            meta: None,
        },
    })
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
    /// The structured answer, and the content block the bytes travel in (`with_bytes`: keep
    /// them in `content_base64` instead, as `/v1` does).
    pub fn from_file(
        f: SessionFile,
        session_id: &str,
        with_bytes: bool,
    ) -> (Self, Option<ContentBlock>) {
        match f {
            SessionFile::Folder { path, entries } => (
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
                },
                None,
            ),
            SessionFile::File {
                path,
                size_bytes,
                sha256,
                offset,
                content,
            } => {
                let mime = outputs::mime_type(&path, &content).to_string();
                let data = base64::engine::general_purpose::STANDARD.encode(&content);
                let whole_image = offset == 0 && content.len() as u64 == size_bytes;
                let block = if with_bytes {
                    None
                } else if outputs::is_image(&mime) && whole_image {
                    Some(ContentBlock::image(data.clone(), mime.clone()))
                } else {
                    let uri = format!("codebox://sessions/{session_id}/{path}");
                    Some(resource(uri, &mime, data.clone()))
                };
                let sent = block.is_some();
                (
                    SessionFileResult {
                        path,
                        size_bytes: Some(size_bytes),
                        mime_type: Some(mime),
                        sha256: Some(sha256),
                        content_base64: (!sent).then_some(data),
                        omitted_reason: sent.then(|| SENT_AS_BLOCK.to_string()),
                        offset: Some(offset),
                        returned_bytes: Some(content.len() as u64),
                        entries: None,
                    },
                    block,
                )
            }
        }
    }
}

/// `read_session_file`'s tool result.
pub fn session_file_result(f: SessionFile, session_id: &str) -> CallToolResult {
    let (structured, block) = SessionFileResult::from_file(f, session_id, false);
    let text = serde_json::to_string(&structured).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.extend(block);
    let mut result = CallToolResult::success(content);
    result.structured_content = serde_json::to_value(&structured).ok();
    result
}
