//! `read_session_file`: a file or a folder of a session's working directory, without running
//! anything.

pub use crate::contract::answers::FolderEntry;
use crate::contract::answers::{FileRead, SessionFileResult};
use crate::contract::RequestError;
use crate::contract::SessionError;
use crate::engine::protocol::{EntryKind, FileEntry};
use crate::executor::outputs;

/// What `read_session_file` found.
#[derive(Debug, Clone, PartialEq)]
pub enum SessionFile {
    File {
        path: String,
        /// The whole file's size and SHA-256.
        size_bytes: u64,
        sha256: String,
        offset: u64,
        /// The bytes from `offset` (at most what was asked for).
        content: Vec<u8>,
    },
    Folder {
        path: String,
        /// The entries directly in it, by name.
        entries: Vec<FolderEntry>,
    },
}

impl SessionFile {
    pub(super) fn from_entries(
        path: &str,
        offset: u64,
        mut entries: Vec<FileEntry>,
    ) -> Result<SessionFile, SessionError> {
        let refuse = |why: &str| {
            Err(RequestError {
                field: "path".into(),
                message: format!("`{path}`: {why}"),
            }
            .into())
        };
        if entries.is_empty() {
            return refuse("the session's container sent nothing for it");
        }
        let first = entries.remove(0);
        match first.kind {
            EntryKind::File
                if first
                    .reason
                    .as_deref()
                    .is_some_and(|r| !r.starts_with("range ")) =>
            {
                refuse(first.reason.as_deref().unwrap_or("not readable"))
            }
            EntryKind::File => Ok(SessionFile::File {
                path: first.path,
                size_bytes: first.size,
                sha256: first.sha256,
                offset,
                content: first.content,
            }),
            EntryKind::Link => refuse("is a symbolic link, which is not followed"),
            EntryKind::Dir => Ok(SessionFile::Folder {
                path: first.path,
                entries: entries
                    .into_iter()
                    .map(|e| FolderEntry {
                        kind: match e.kind {
                            EntryKind::Dir => "folder",
                            EntryKind::Link => "link",
                            EntryKind::File => "file",
                        }
                        .into(),
                        path: e.path,
                        size_bytes: e.size,
                    })
                    .collect(),
            }),
        }
    }
}

impl SessionFile {
    /// What every door answers for it; `sent_as_block`: the bytes travel beside the answer
    /// (as an MCP content block), not in `content_base64`.
    pub fn answer(&self, sent_as_block: bool) -> SessionFileResult {
        match self {
            SessionFile::Folder { path, entries } => {
                SessionFileResult::folder(path.clone(), entries.clone())
            }
            SessionFile::File {
                path,
                size_bytes,
                sha256,
                offset,
                content,
            } => {
                let read = FileRead {
                    path,
                    size_bytes: *size_bytes,
                    sha256,
                    offset: *offset,
                    content,
                };
                SessionFileResult::file(read, outputs::mime_type(path, content), sent_as_block)
            }
        }
    }
}
