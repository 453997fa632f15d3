//! Tool results: a run report with its files as content blocks (each file's bytes travel
//! once), and a session's file or folder.

use base64::Engine as _;
use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};

use crate::contract::answers::SENT_AS_BLOCK;
use crate::executor::outputs;
use crate::report::RunReport;
use crate::sessions::SessionFile;

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

/// `read_session_file`'s tool result: the answer, and the bytes read as a content block (an
/// image block for a whole image, else an embedded resource).
pub fn session_file_result(f: SessionFile, session_id: &str) -> CallToolResult {
    let structured = f.answer(true);
    let block = match &f {
        SessionFile::Folder { .. } => None,
        SessionFile::File {
            path,
            size_bytes,
            offset,
            content,
            ..
        } => {
            let mime = outputs::mime_type(path, content);
            let data = base64::engine::general_purpose::STANDARD.encode(content);
            let whole_image = *offset == 0 && content.len() as u64 == *size_bytes;
            Some(if outputs::is_image(mime) && whole_image {
                ContentBlock::image(data, mime)
            } else {
                let uri = format!("codebox://sessions/{session_id}/{path}");
                resource(uri, mime, data)
            })
        }
    };
    let text = serde_json::to_string(&structured).unwrap_or_default();
    let mut content = vec![ContentBlock::text(text)];
    content.extend(block);
    let mut result = CallToolResult::success(content);
    result.structured_content = serde_json::to_value(&structured).ok();
    result
}
