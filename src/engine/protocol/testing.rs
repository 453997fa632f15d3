//! The other side of the protocol, for the fake engine and tests: frames as `codebox-init`
//! writes them, payloads read back.

use std::time::Duration;

use bytes::Bytes;

use super::{Collect, Entry, EntryKind, Files, Payload, MAGIC};

/// Write one frame, as `codebox-init` does (for the fake engine and tests).
pub fn frame(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + body.len());
    v.push(kind);
    v.extend_from_slice(&(body.len() as u32).to_be_bytes());
    v.extend_from_slice(body);
    v
}

/// Read a payload back (for the fake engine and tests): the records and the stdin.
pub fn parse_payload(bytes: &[u8]) -> Option<Payload> {
    parse(bytes).map(|(mut p, entries)| {
        p.files = Files::new(&entries);
        p
    })
}

/// A payload and its working-directory entries.
pub(super) fn parse(bytes: &[u8]) -> Option<(Payload, Vec<Entry>)> {
    let mut rest = bytes.strip_prefix(MAGIC)?;
    let mut p = Payload::default();
    // Each argument is followed by a NUL, so the last piece of the split is always empty.
    let split_argv = |v: &[u8]| -> Vec<String> {
        let mut args: Vec<String> = v
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        args.pop();
        args
    };
    let (mut max_files, mut max_bytes, mut max_file_bytes, mut collect) = (0, 0, 0, "none");
    let mut entries = Vec::new();
    loop {
        let nl = rest.iter().position(|b| *b == b'\n')?;
        let header = std::str::from_utf8(&rest[..nl]).ok()?;
        let (name, len) = header.split_once(' ')?;
        let len: usize = len.parse().ok()?;
        let value = rest.get(nl + 1..nl + 1 + len)?;
        rest = &rest[nl + 1 + len..];
        let text = || String::from_utf8_lossy(value).into_owned();
        let ms = || Duration::from_millis(text().parse().unwrap_or(0));
        match name {
            "env" => {
                let t = text();
                let (k, v) = t.split_once('=')?;
                p.env.insert(k.to_string(), v.to_string());
            }
            "check" => p.check = Some(split_argv(value)),
            "run" => p.run = Some(split_argv(value)),
            "check_timeout_ms" => p.check_timeout = ms(),
            "timeout_ms" => p.timeout = ms(),
            "output_limit" => p.output_limit = text().parse().ok()?,
            "collect" => {
                collect = match value {
                    b"outputs" => "outputs",
                    b"workspace-on-success" => "workspace",
                    _ => "none",
                }
            }
            "max_files" => max_files = text().parse().ok()?,
            "max_bytes" => max_bytes = text().parse().ok()?,
            "max_file_bytes" => max_file_bytes = text().parse().ok()?,
            "dir" => {
                let t = text();
                let (mode, path) = t.split_once(' ')?;
                entries.push(Entry {
                    kind: EntryKind::Dir,
                    path: path.to_string(),
                    mode: u32::from_str_radix(mode, 8).ok()?,
                    content: Bytes::new(),
                    target: String::new(),
                });
            }
            "file" => {
                let nul = value.iter().position(|b| *b == 0)?;
                let head = std::str::from_utf8(&value[..nul]).ok()?;
                let (mode, path) = head.split_once(' ')?;
                entries.push(Entry::file(
                    path,
                    u32::from_str_radix(mode, 8).ok()?,
                    Bytes::copy_from_slice(&value[nul + 1..]),
                ));
            }
            "link" => {
                let t = text();
                let (path, target) = t.split_once('\0')?;
                entries.push(Entry {
                    kind: EntryKind::Link,
                    path: path.to_string(),
                    mode: 0o777,
                    content: Bytes::new(),
                    target: target.to_string(),
                });
            }
            "end" => break,
            _ => return None,
        }
    }
    p.collect = Some(match collect {
        "outputs" => Collect::Outputs {
            max_files,
            max_bytes,
            max_file_bytes,
        },
        "workspace" => Collect::WorkspaceOnSuccess { max_bytes },
        _ => Collect::None,
    });
    p.stdin = (!rest.is_empty()).then(|| Bytes::copy_from_slice(rest));
    Some((p, entries))
}
