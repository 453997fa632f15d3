//! What codebox writes to a container's stdin: the payload of records (files, commands,
//! limits), then the program's stdin.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

#[cfg(any(test, feature = "testing"))]
use super::testing::parse;
use super::MAGIC;

/// The kind of a workspace entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Dir,
    Link,
}

/// One entry of a working directory: what the payload lays out, and what the compile stage
/// hands back.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub kind: EntryKind,
    /// Relative to the working directory, `/`-separated, no `.` or `..`.
    pub path: String,
    pub mode: u32,
    /// File content (empty for directories and links).
    pub content: Bytes,
    /// Link target.
    pub target: String,
}

impl Entry {
    pub fn file(path: impl Into<String>, mode: u32, content: impl Into<Bytes>) -> Entry {
        Entry {
            kind: EntryKind::File,
            path: path.into(),
            mode,
            content: content.into(),
            target: String::new(),
        }
    }
}

/// Which files `codebox-init` sends back after the program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Collect {
    None,
    /// What the program left under `outputs/`, within these caps.
    Outputs {
        max_files: usize,
        max_bytes: u64,
        max_file_bytes: u64,
    },
    /// The whole working directory, if the program exited 0 (the compile stage's artifacts).
    WorkspaceOnSuccess {
        max_bytes: u64,
    },
}

/// Working-directory entries, encoded once as payload records: every payload that lays
/// them out (each test case of a run, say) shares the same bytes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Files {
    records: Bytes,
    count: usize,
    content_bytes: u64,
}

impl Files {
    pub fn new(entries: &[Entry]) -> Files {
        let content: usize = entries.iter().map(|e| e.content.len()).sum();
        let mut out = Vec::with_capacity(content + 64 * entries.len());
        for e in entries {
            match e.kind {
                EntryKind::Dir => record(
                    &mut out,
                    "dir",
                    format!("{:o} {}", e.mode, e.path).as_bytes(),
                ),
                EntryKind::File => {
                    let mut head = format!("{:o} {}\0", e.mode, e.path).into_bytes();
                    out.extend_from_slice(
                        format!("file {}\n", head.len() + e.content.len()).as_bytes(),
                    );
                    out.append(&mut head);
                    out.extend_from_slice(&e.content);
                }
                EntryKind::Link => record(
                    &mut out,
                    "link",
                    format!("{}\0{}", e.path, e.target).as_bytes(),
                ),
            }
        }
        Files {
            records: Bytes::from(out),
            count: entries.len(),
            content_bytes: content as u64,
        }
    }

    /// How many entries.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The bytes of all files' content.
    pub(crate) fn content_bytes(&self) -> u64 {
        self.content_bytes
    }

    /// The encoded records, shared.
    pub(super) fn records(&self) -> Bytes {
        self.records.clone()
    }

    /// The bytes of the encoded records (what is kept in memory).
    pub(crate) fn encoded_bytes(&self) -> u64 {
        self.records.len() as u64
    }

    /// The entries, decoded again (for the fake engine and tests).
    #[cfg(any(test, feature = "testing"))]
    pub fn entries(&self) -> Vec<Entry> {
        let mut payload = MAGIC.to_vec();
        payload.extend_from_slice(&self.records);
        record(&mut payload, "end", b"");
        parse(&payload).map_or_else(Vec::new, |(_, entries)| entries)
    }
}

/// Everything a container is told.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Payload {
    pub env: BTreeMap<String, String>,
    pub check: Option<Vec<String>>,
    pub run: Option<Vec<String>>,
    /// `run` checks the source itself before the program (the `check_in_run` record): its
    /// check phase has `check_timeout`.
    pub check_in_run: bool,
    pub check_timeout: Duration,
    pub timeout: Duration,
    pub output_limit: u64,
    pub collect: Option<Collect>,
    pub files: Files,
    pub stdin: Option<Bytes>,
}

/// The records of `collect outputs` and its caps (nothing for another `collect`).
pub(super) fn outputs_records(out: &mut Vec<u8>, collect: Collect) {
    if let Collect::Outputs {
        max_files,
        max_bytes,
        max_file_bytes,
    } = collect
    {
        record(out, "collect", b"outputs");
        record(out, "max_files", max_files.to_string().as_bytes());
        record(out, "max_bytes", max_bytes.to_string().as_bytes());
        record(out, "max_file_bytes", max_file_bytes.to_string().as_bytes());
    }
}

pub(super) fn record(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(format!("{name} {}\n", value.len()).as_bytes());
    out.extend_from_slice(value);
}

pub(super) fn argv(args: &[String]) -> Vec<u8> {
    let mut v = Vec::new();
    for a in args {
        v.extend_from_slice(a.as_bytes());
        v.push(0);
    }
    v
}

impl Payload {
    /// The bytes for the container's stdin, in the order they are written: the settings,
    /// the files (shared, not copied), then the end record and the program's stdin.
    pub fn encode(&self) -> Vec<Bytes> {
        let mut head = Vec::with_capacity(512);
        head.extend_from_slice(MAGIC);
        for (k, v) in &self.env {
            record(&mut head, "env", format!("{k}={v}").as_bytes());
        }
        if let Some(c) = &self.check {
            record(&mut head, "check", &argv(c));
        }
        if let Some(r) = &self.run {
            record(&mut head, "run", &argv(r));
        }
        if self.check_in_run {
            record(&mut head, "check_in_run", b"1");
        }
        if self.check.is_some() || self.check_in_run {
            let ms = self.check_timeout.as_millis().to_string();
            record(&mut head, "check_timeout_ms", ms.as_bytes());
        }
        record(
            &mut head,
            "timeout_ms",
            self.timeout.as_millis().to_string().as_bytes(),
        );
        record(
            &mut head,
            "output_limit",
            self.output_limit.to_string().as_bytes(),
        );
        match self.collect.unwrap_or(Collect::None) {
            Collect::None => record(&mut head, "collect", b"none"),
            outputs @ Collect::Outputs { .. } => outputs_records(&mut head, outputs),
            Collect::WorkspaceOnSuccess { max_bytes } => {
                record(&mut head, "collect", b"workspace-on-success");
                record(&mut head, "max_bytes", max_bytes.to_string().as_bytes());
            }
        }
        let mut tail = Vec::new();
        record(&mut tail, "end", b"");
        let mut parts = vec![
            Bytes::from(head),
            self.files.records.clone(),
            Bytes::from(tail),
        ];
        if let Some(s) = &self.stdin {
            parts.push(s.clone());
        }
        parts
    }

    /// All of [`Payload::encode`] in one buffer (for tests).
    #[cfg(test)]
    fn encode_whole(&self) -> Vec<u8> {
        self.encode().concat()
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_payload;
    use super::*;

    #[test]
    fn payloads_read_back_as_written() {
        let p = Payload {
            env: BTreeMap::from([("A".into(), "1=2".into())]),
            check: Some(vec!["python3".into(), "-c".into(), "x".into()]),
            run: Some(vec!["python3".into(), "main.py".into(), "".into()]),
            check_in_run: false,
            check_timeout: Duration::from_millis(1500),
            timeout: Duration::from_secs(30),
            output_limit: 1024,
            collect: Some(Collect::Outputs {
                max_files: 32,
                max_bytes: 8,
                max_file_bytes: 4,
            }),
            files: Files::new(&[
                Entry {
                    kind: EntryKind::Dir,
                    path: "d".into(),
                    mode: 0o755,
                    content: Bytes::new(),
                    target: String::new(),
                },
                Entry::file("d/main.py", 0o644, &b"print(1)\n\0binary"[..]),
            ]),
            stdin: Some(Bytes::from_static(b"in\nput")),
        };
        let back = parse_payload(&p.encode_whole()).unwrap();
        assert_eq!(back, p);
        assert_eq!(back.files.entries()[1].content, &b"print(1)\n\0binary"[..]);
    }

    #[test]
    fn a_run_that_checks_itself_reads_back_with_its_check_timeout() {
        let p = Payload {
            run: Some(vec!["python3".into(), "-c".into(), "x".into()]),
            check_in_run: true,
            check_timeout: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            collect: Some(Collect::None),
            ..Default::default()
        };
        let bytes = p.encode_whole();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("check_in_run 1\n1"), "{text}");
        assert!(text.contains("check_timeout_ms 5\n30000"), "{text}");
        assert_eq!(parse_payload(&bytes).unwrap(), p);
    }

    #[test]
    fn payloads_share_their_files_instead_of_copying_them() {
        let files = Files::new(&[Entry::file("big.bin", 0o644, vec![7u8; 1 << 20])]);
        let payload = |stdin: &'static [u8]| Payload {
            run: Some(vec!["./main".into()]),
            files: files.clone(),
            stdin: Some(Bytes::from_static(stdin)),
            ..Default::default()
        };
        let (a, b) = (payload(b"1").encode(), payload(b"2").encode());
        assert_eq!(a[1].as_ptr(), b[1].as_ptr(), "one copy of the files");
        assert_eq!(a[1].len() as u64, files.encoded_bytes());
        assert_ne!(a.concat(), b.concat());
    }
}
