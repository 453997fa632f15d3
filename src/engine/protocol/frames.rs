//! What `codebox-init` writes back: frames, decoded incrementally and within bounds.

use std::collections::BTreeMap;

use super::EntryKind;

/// Largest frame accepted (the helper writes at most 64 KiB at a time).
const MAX_FRAME: usize = 1 << 20;
/// Most bytes reserved ahead for a file's content: its size is only announced; the rest grows
/// as `B` frames arrive.
const MAX_RESERVE: u64 = 1 << 16;
/// Highest signal number Linux has (`SIGRTMAX`).
const MAX_SIGNAL: i64 = 64;

/// Which part of a stage a phase is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseName {
    Check,
    Run,
}

/// How a phase ended, as `codebox-init` saw it.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    Exited(i64),
    Signaled(i64),
    TimedOut,
    Stopped,
    /// The command could not be executed (e.g. it does not exist in the image).
    Error(String),
}

/// The figures of an ended phase.
#[derive(Debug, Clone, PartialEq)]
pub struct PhaseEnd {
    pub end: End,
    pub wall_ms: u64,
    pub cpu_ms: Option<u64>,
    pub peak_kb: Option<u64>,
    /// The memory cgroup's OOM kills during the phase; `None` when unknown.
    pub oom_kills: Option<u64>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// One phase: its output (capped) and, once it ended, its figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub name: PhaseName,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Bytes received beyond the host's cap (the helper caps first; this is a backstop).
    pub dropped: u64,
    pub end: Option<PhaseEnd>,
}

/// A file entry sent back.
#[derive(Debug, Clone, PartialEq)]
pub struct FileEntry {
    pub kind: EntryKind,
    pub path: String,
    pub mode: u32,
    pub size: u64,
    pub sha256: String,
    /// Why the content was not sent; `None` when it was.
    pub reason: Option<String>,
    pub target: String,
    pub content: Vec<u8>,
}

/// Everything decoded from one container.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Decoded {
    pub phases: Vec<Phase>,
    pub files: Vec<FileEntry>,
    pub warnings: Vec<String>,
    /// A fatal error `codebox-init` reported.
    pub fatal: Option<String>,
    /// A session's cell: the value of its final expression (at most the output cap).
    pub result: Option<Vec<u8>>,
    /// A session's request is done: what its `D` frame said.
    pub done: Option<super::session::Done>,
    /// The end frame arrived (`Z`, or a session request's `D`).
    pub complete: bool,
}

impl Decoded {
    pub fn phase(&self, name: PhaseName) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }
}

/// Bounds of what the decoder keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct DecodeLimits {
    /// Bytes kept per stream per phase.
    pub output: u64,
    /// File content bytes kept in all.
    pub content: u64,
    /// File entries kept.
    pub entries: usize,
}

/// A stream that does not follow the protocol.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("codebox-init sent a malformed stream: {0}")]
pub(crate) struct ProtocolError(pub String);

/// What a frame brought that a live reader shows, in the order the frames came.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum News {
    /// Output kept (within the cap) of the current phase: `stdout` or stderr.
    Output { stdout: bool, bytes: Vec<u8> },
    /// The cap of a stream was reached in the current phase.
    Capped { stdout: bool },
    /// A file entry.
    File { path: String, size: u64 },
}

/// Incremental frame decoder.
pub(crate) struct Decoder {
    limits: DecodeLimits,
    buf: Vec<u8>,
    content: u64,
    /// Content bytes still owed to the last file entry.
    owed: u64,
    out: Decoded,
    /// What live readers are shown, when asked for ([`Decoder::with_news`]).
    news: Option<Vec<News>>,
    /// Streams of the current phase whose cap was reported.
    capped: [bool; 2],
}

fn malformed<T>(why: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(why.into()))
}

fn parse_end(text: &str) -> Result<(PhaseName, PhaseEnd), ProtocolError> {
    let mut kv = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            kv.insert(k, v);
        }
    }
    let num = |k: &str| kv.get(k).and_then(|v| v.parse::<i64>().ok());
    let count = |k: &str| num(k).filter(|v| *v >= 0).map(|v| v as u64);
    let name = match kv.get("phase").copied() {
        Some("check") => PhaseName::Check,
        Some("run") => PhaseName::Run,
        other => return malformed(format!("phase end without a known phase: {other:?}")),
    };
    let end = match kv.get("end").copied() {
        Some("exited") => End::Exited(num("code").unwrap_or(-1)),
        Some("signaled") => match num("signal") {
            Some(n) if (1..=MAX_SIGNAL).contains(&n) => End::Signaled(n),
            other => return malformed(format!("a death by signal {other:?}")),
        },
        Some("timed_out") => End::TimedOut,
        Some("stopped") => End::Stopped,
        Some("error") => End::Error(kv.get("error").unwrap_or(&"unknown error").to_string()),
        other => return malformed(format!("unknown phase end {other:?}")),
    };
    Ok((
        name,
        PhaseEnd {
            end,
            wall_ms: count("wall_ms").unwrap_or(0),
            cpu_ms: count("cpu_ms"),
            peak_kb: count("peak_kb"),
            oom_kills: count("oom_kills"),
            stdout_bytes: count("stdout_bytes").unwrap_or(0),
            stderr_bytes: count("stderr_bytes").unwrap_or(0),
        },
    ))
}

impl Decoder {
    pub fn new(limits: DecodeLimits) -> Decoder {
        Decoder {
            limits,
            buf: Vec::new(),
            content: 0,
            owed: 0,
            out: Decoded::default(),
            news: None,
            capped: [false; 2],
        }
    }

    /// Keep [`News`] of what arrives from now on, for [`Decoder::take_news`].
    pub(crate) fn keep_news(&mut self) {
        self.news.get_or_insert_with(Vec::new);
    }

    /// The news since the last call.
    pub(crate) fn take_news(&mut self) -> Vec<News> {
        self.news.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn tell(&mut self, news: News) {
        if let Some(n) = &mut self.news {
            n.push(news);
        }
    }

    /// What was decoded so far.
    pub(crate) fn decoded(&self) -> &Decoded {
        &self.out
    }

    pub fn finish(self) -> Decoded {
        self.out
    }

    /// Feed bytes of the container's stdout.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), ProtocolError> {
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        let result = loop {
            let rest = &self.buf[at..];
            if rest.len() < 5 {
                break Ok(());
            }
            let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
            if len > MAX_FRAME {
                break malformed(format!("a frame of {len} bytes"));
            }
            if rest.len() < 5 + len {
                break Ok(());
            }
            let kind = rest[0];
            let body = rest[5..5 + len].to_vec();
            at += 5 + len;
            if let Err(e) = self.frame(kind, &body) {
                break Err(e);
            }
        };
        self.buf.drain(..at);
        result
    }

    fn current(&mut self) -> Result<&mut Phase, ProtocolError> {
        match self.out.phases.last_mut() {
            Some(p) if p.end.is_none() => Ok(p),
            _ => malformed("output outside a phase"),
        }
    }

    fn frame(&mut self, kind: u8, body: &[u8]) -> Result<(), ProtocolError> {
        if self.out.complete {
            return malformed("a frame after the end");
        }
        if self.owed > 0 && kind != b'B' {
            return malformed("a file's content ended early");
        }
        let limit = self.limits.output;
        match kind {
            b'P' => {
                let name = match body {
                    b"check" => PhaseName::Check,
                    b"run" => PhaseName::Run,
                    _ => return malformed("unknown phase"),
                };
                if self.out.phases.iter().any(|p| p.name == name) {
                    return malformed("a phase started twice");
                }
                self.out.phases.push(Phase {
                    name,
                    stdout: Vec::new(),
                    stderr: Vec::new(),
                    dropped: 0,
                    end: None,
                });
                self.capped = [false; 2];
            }
            b'O' | b'E' => {
                let stdout = kind == b'O';
                let phase = self.current()?;
                let stream = if stdout {
                    &mut phase.stdout
                } else {
                    &mut phase.stderr
                };
                let room = (limit as usize).saturating_sub(stream.len());
                let keep = body.len().min(room);
                stream.extend_from_slice(&body[..keep]);
                let full = stream.len() as u64 >= limit;
                phase.dropped += (body.len() - keep) as u64;
                if keep > 0 {
                    self.tell(News::Output {
                        stdout,
                        bytes: body[..keep].to_vec(),
                    });
                }
                let i = usize::from(!stdout);
                if full && !self.capped[i] {
                    self.capped[i] = true;
                    self.tell(News::Capped { stdout });
                }
            }
            b'X' => {
                let text = String::from_utf8_lossy(body);
                let (name, end) = parse_end(&text)?;
                let phase = self.current()?;
                if phase.name != name {
                    return malformed("the end of a phase that is not running");
                }
                let over = [
                    end.stdout_bytes > phase.stdout.len() as u64,
                    end.stderr_bytes > phase.stderr.len() as u64,
                ];
                phase.end = Some(end);
                for (i, over) in over.into_iter().enumerate() {
                    if over && !self.capped[i] {
                        self.capped[i] = true;
                        self.tell(News::Capped { stdout: i == 0 });
                    }
                }
            }
            b'F' => {
                if self.out.files.len() >= self.limits.entries {
                    return malformed(format!("more than {} file entries", self.limits.entries));
                }
                let text = String::from_utf8_lossy(body);
                let f: Vec<&str> = text.split('\0').collect();
                if f.len() != 7 {
                    return malformed("a file entry without its 7 fields");
                }
                let kind = match f[0] {
                    "f" => EntryKind::File,
                    "d" => EntryKind::Dir,
                    "l" => EntryKind::Link,
                    _ => return malformed("unknown file kind"),
                };
                let size: u64 = f[3].parse().map_err(|_| ProtocolError("bad size".into()))?;
                let mode =
                    u32::from_str_radix(f[2], 8).map_err(|_| ProtocolError("bad mode".into()))?;
                let reason = (!f[5].is_empty()).then(|| f[5].to_string());
                // A session's `read` of part of a file: `range <n>`, n bytes follow.
                let range = match reason.as_deref().and_then(|r| r.strip_prefix("range ")) {
                    Some(n) => Some(
                        n.parse::<u64>()
                            .map_err(|_| ProtocolError("bad range".into()))?,
                    ),
                    None => None,
                };
                let content = match (kind, &reason, range) {
                    (EntryKind::File, None, _) => Some(size),
                    (EntryKind::File, Some(_), Some(n)) => Some(n),
                    _ => None,
                };
                if let Some(size) = content {
                    match self.content.checked_add(size) {
                        Some(total) if total <= self.limits.content => self.content = total,
                        _ => {
                            return malformed(format!(
                                "more than {} bytes of file content",
                                self.limits.content
                            ))
                        }
                    }
                    self.owed = size;
                }
                if kind == EntryKind::File {
                    self.tell(News::File {
                        path: f[1].to_string(),
                        size,
                    });
                }
                self.out.files.push(FileEntry {
                    kind,
                    path: f[1].to_string(),
                    mode,
                    size,
                    sha256: f[4].to_string(),
                    reason,
                    target: f[6].to_string(),
                    content: Vec::with_capacity(self.owed.min(MAX_RESERVE) as usize),
                });
            }
            b'B' => {
                if body.len() as u64 > self.owed {
                    return malformed("more file content than announced");
                }
                self.owed -= body.len() as u64;
                if let Some(f) = self.out.files.last_mut() {
                    f.content.extend_from_slice(body);
                }
            }
            b'W' => {
                if self.out.warnings.len() < 16 {
                    self.out
                        .warnings
                        .push(String::from_utf8_lossy(body).into_owned());
                }
            }
            b'!' => self.out.fatal = Some(String::from_utf8_lossy(body).into_owned()),
            b'Z' => self.out.complete = true,
            b'R' => {
                if self.out.result.is_some() {
                    return malformed("a second result");
                }
                let keep = body.len().min(limit as usize);
                self.out.result = Some(body[..keep].to_vec());
            }
            b'D' => {
                self.out.done = Some(super::session::parse_done(&String::from_utf8_lossy(body))?);
                self.out.complete = true;
            }
            other => return malformed(format!("unknown frame kind {other:#04x}")),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame;
    use super::*;

    /// An `F` frame's body: its seven fields, NUL-separated.
    fn entry(fields: [&str; 7]) -> Vec<u8> {
        fields.join("\0").into_bytes()
    }

    fn limits() -> DecodeLimits {
        DecodeLimits {
            output: 4,
            content: 10,
            entries: 3,
        }
    }

    #[test]
    fn news_comes_in_frame_order_with_the_caps_and_only_when_asked_for() {
        let mut bytes = Vec::new();
        bytes.extend(frame(b'P', b"run"));
        bytes.extend(frame(b'E', b"e1"));
        bytes.extend(frame(b'O', b"o1"));
        bytes.extend(frame(b'E', b"e2"));
        bytes.extend(frame(b'O', b"o2345"));
        bytes.extend(frame(
            b'X',
            b"phase=run\nend=exited\ncode=0\nwall_ms=1\noom_kills=0\nstdout_bytes=7\nstderr_bytes=9\n",
        ));
        bytes.extend(frame(
            b'F',
            &entry(["f", "outputs/a", "644", "2", "ab", "", ""]),
        ));
        bytes.extend(frame(b'B', b"ab"));
        let mut quiet = Decoder::new(limits());
        quiet.push(&bytes).unwrap();
        assert!(quiet.take_news().is_empty());
        let mut d = Decoder::new(limits());
        d.keep_news();
        d.push(&bytes).unwrap();
        let out = |stdout, b: &[u8]| News::Output {
            stdout,
            bytes: b.to_vec(),
        };
        assert_eq!(
            d.take_news(),
            vec![
                out(false, b"e1"),
                out(true, b"o1"),
                out(false, b"e2"),
                // Full at its cap: told once, where it happened.
                News::Capped { stdout: false },
                out(true, b"o2"),
                News::Capped { stdout: true },
                News::File {
                    path: "outputs/a".into(),
                    size: 2
                },
            ]
        );
        assert!(d.take_news().is_empty(), "news is taken once");

        // Output codebox-init dropped past its own cap (never framed): the phase's end tells.
        let mut d = Decoder::new(limits());
        d.keep_news();
        let mut bytes = frame(b'P', b"run");
        bytes.extend(frame(b'O', b"ab"));
        bytes.extend(frame(
            b'X',
            b"phase=run\nend=exited\ncode=0\nwall_ms=1\noom_kills=0\nstdout_bytes=900\nstderr_bytes=0\n",
        ));
        d.push(&bytes).unwrap();
        assert_eq!(
            d.take_news(),
            vec![out(true, b"ab"), News::Capped { stdout: true }]
        );
    }

    #[test]
    fn frames_decode_in_any_chunking_and_output_is_capped() {
        let mut bytes = Vec::new();
        bytes.extend(frame(b'P', b"run"));
        bytes.extend(frame(b'O', b"hello"));
        bytes.extend(frame(b'E', b"er"));
        bytes.extend(frame(
            b'X',
            b"phase=run\nend=exited\ncode=3\nwall_ms=5\ncpu_ms=2\npeak_kb=900\noom_kills=0\nstdout_bytes=5\nstderr_bytes=2\n",
        ));
        bytes.extend(frame(
            b'F',
            &entry(["f", "outputs/a", "644", "3", "abc", "", ""]),
        ));
        bytes.extend(frame(b'B', b"xyz"));
        bytes.extend(frame(b'Z', b""));
        for chunk in [1, 2, 7, bytes.len()] {
            let mut d = Decoder::new(limits());
            for c in bytes.chunks(chunk) {
                d.push(c).unwrap();
            }
            let out = d.finish();
            assert!(out.complete);
            let run = out.phase(PhaseName::Run).unwrap();
            assert_eq!(run.stdout, b"hell");
            assert_eq!(run.dropped, 1);
            let end = run.end.as_ref().unwrap();
            assert_eq!(end.end, End::Exited(3));
            assert_eq!(
                (end.cpu_ms, end.peak_kb, end.oom_kills),
                (Some(2), Some(900), Some(0))
            );
            assert_eq!(out.files[0].content, b"xyz");
            assert_eq!(out.files[0].mode, 0o644);
        }
    }

    #[test]
    fn hostile_streams_are_errors_not_panics_or_unbounded_buffers() {
        let cases: Vec<Vec<u8>> = vec![
            frame(b'O', b"output before any phase"),
            [frame(b'P', b"run"), frame(b'P', b"run")].concat(),
            frame(b'?', b""),
            vec![b'O', 0xff, 0xff, 0xff, 0xff],
            [
                frame(b'F', &entry(["f", "a", "644", "999", "", "", ""])),
                frame(b'B', b"x"),
            ]
            .concat(),
            [
                frame(b'F', &entry(["f", "a", "644", "2", "", "", ""])),
                frame(b'B', b"xyz"),
            ]
            .concat(),
            [
                frame(b'F', &entry(["f", "a", "644", "2", "", "", ""])),
                frame(b'Z', b""),
            ]
            .concat(),
            [
                frame(b'F', &entry(["d", "a", "755", "0", "", "", ""])),
                frame(b'F', &entry(["d", "b", "755", "0", "", "", ""])),
                frame(b'F', &entry(["d", "c", "755", "0", "", "", ""])),
                frame(b'F', &entry(["d", "d", "755", "0", "", "", ""])),
            ]
            .concat(),
            [frame(b'Z', b""), frame(b'P', b"run")].concat(),
            [
                frame(b'P', b"run"),
                frame(b'X', b"phase=check\nend=exited\n"),
            ]
            .concat(),
            // Sizes near u64::MAX: the running total of content must not wrap around, and
            // nothing may be reserved for what was merely announced.
            [
                frame(b'F', &entry(["f", "a", "644", "1", "", "", ""])),
                frame(b'B', b"x"),
                frame(
                    b'F',
                    &entry(["f", "b", "644", &u64::MAX.to_string(), "", "", ""]),
                ),
            ]
            .concat(),
            frame(
                b'F',
                &entry(["f", "a", "644", &(u64::MAX - 1).to_string(), "", "", ""]),
            ),
            // A signal number no kernel has.
            [
                frame(b'P', b"run"),
                frame(
                    b'X',
                    format!("phase=run\nend=signaled\nsignal={}\n", i64::MAX).as_bytes(),
                ),
            ]
            .concat(),
        ];
        for (i, bytes) in cases.iter().enumerate() {
            let mut d = Decoder::new(limits());
            assert!(d.push(bytes).is_err(), "case {i} was accepted");
        }
    }

    #[test]
    fn an_announced_size_reserves_at_most_a_chunk() {
        let mut d = Decoder::new(DecodeLimits {
            content: u64::MAX,
            ..limits()
        });
        let f = entry(["f", "a", "644", &(1u64 << 40).to_string(), "", "", ""]);
        d.push(&[frame(b'F', &f), frame(b'B', b"xy")].concat())
            .unwrap();
        let file = &d.decoded().files[0];
        assert_eq!(file.content, b"xy");
        assert!(file.content.capacity() <= MAX_RESERVE as usize);
        assert!(
            d.push(&frame(b'Z', b"")).is_err(),
            "the content ended early"
        );
    }
}
