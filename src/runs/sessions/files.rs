//! `read_session_file`: a file or a folder of a session's working directory, without running
//! anything.

use super::{EndReason, SessionError};
pub use crate::contract::answers::FolderEntry;
use crate::engine::protocol::{EntryKind, FileEntry};
use crate::executor::session::{Broken, ReadError};
use crate::contract::{check_relative_path, RequestError};
use crate::runs::RunManager;

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
    fn from_entries(
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

impl RunManager {
    /// A file of a session's working directory (`offset`, at most `max_bytes`, within the
    /// output cap), or a folder's listing, without running anything. Symbolic links are not
    /// followed. The idle clock starts again.
    pub async fn read_session_file(
        &self,
        id: &str,
        path: &str,
        offset: u64,
        max_bytes: Option<u64>,
    ) -> Result<SessionFile, SessionError> {
        let path = check_relative_path("path", path)?;
        let cap = self.inner.config.sandbox.output_limit_bytes;
        let max_bytes = match max_bytes {
            Some(0) => {
                return Err(RequestError {
                    field: "max_bytes".into(),
                    message: format!("must be between 1 and {cap}"),
                }
                .into())
            }
            Some(m) if m > cap => {
                return Err(RequestError {
                    field: "max_bytes".into(),
                    message: format!("requested {m} bytes; at most {cap} are returned per call (sandbox.output_limit_bytes); use offset for the rest"),
                }
                .into())
            }
            Some(m) => m,
            None => cap,
        };
        let container = {
            let mut st = self.lock();
            let s = st.sessions.usable(id)?;
            s.touch();
            s.container.clone()
        };
        let read = self
            .inner
            .executor
            .read_in_session(&container, &path, offset, max_bytes)
            .await;
        {
            let mut st = self.lock();
            if let Some(s) = st.sessions.open.get_mut(id) {
                s.touch();
            }
        }
        let read = match read {
            Ok(r) => r,
            Err(ReadError::Refused(why)) => {
                // codebox-init names the path itself: "a/b.txt: No such file or directory".
                let why = why.strip_prefix(&format!("{path}: ")).unwrap_or(&why);
                if why == "No such file or directory" {
                    return Err(SessionError::NoSuchFile { path });
                }
                return Err(RequestError {
                    field: "path".into(),
                    message: format!("`{path}`: {why}"),
                }
                .into());
            }
            Err(ReadError::Broken(b)) => {
                let reason = match b {
                    Broken::OutOfMemory => EndReason::OutOfMemory,
                    Broken::Failed(why) => EndReason::Failed(format!("its sandbox failed: {why}")),
                };
                let mut st = self.lock();
                self.end_session(&mut st, id, reason.clone());
                return Err(SessionError::ended(id, &reason));
            }
        };
        SessionFile::from_entries(&path, offset, read.decoded.files)
    }
}
