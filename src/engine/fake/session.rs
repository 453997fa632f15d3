//! The fake's `codebox-init` in session mode (docs/sandbox-init.md, "Session mode"): it answers
//! the opening payload and every `exec` and `read` request with frames, acting out the next
//! scripted [`Behaviour`] per execution (script them once the session is open: the behaviour
//! taken when its container was attached is not used), and keeps an interpreter state (`new`
//! after the start or a reset, then `kept`).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::io::{AsyncReadExt, DuplexStream};
use tokio::sync::mpsc;

use super::{lock, phase_end, Behaviour, State};
use crate::engine::protocol::frame;
use crate::engine::{EngineError, Output, Signal};

/// Reads the records of a payload or request as they arrive, keeping every byte read.
pub(super) struct Reader {
    input: DuplexStream,
    pub buf: Vec<u8>,
    pos: usize,
}

impl Reader {
    pub fn new(input: DuplexStream) -> Reader {
        Reader {
            input,
            buf: Vec::new(),
            pos: 0,
        }
    }

    async fn fill(&mut self, n: usize) -> bool {
        while self.buf.len() - self.pos < n {
            let mut chunk = [0u8; 8192];
            match self.input.read(&mut chunk).await {
                Ok(0) | Err(_) => return false,
                Ok(k) => self.buf.extend_from_slice(&chunk[..k]),
            }
        }
        true
    }

    pub async fn line(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf[self.pos..].iter().position(|b| *b == b'\n') {
                let line = String::from_utf8_lossy(&self.buf[self.pos..self.pos + i]).into_owned();
                self.pos += i + 1;
                return Some(line);
            }
            let have = self.buf.len() - self.pos;
            if !self.fill(have + 1).await {
                return None;
            }
        }
    }

    /// The next record: its name and value.
    pub async fn record(&mut self) -> Option<(String, Vec<u8>)> {
        let header = self.line().await?;
        let (name, len) = header.split_once(' ')?;
        let len: usize = len.parse().ok()?;
        if !self.fill(len).await {
            return None;
        }
        let value = self.buf[self.pos..self.pos + len].to_vec();
        self.pos += len;
        Some((name.to_string(), value))
    }

    /// Everything up to the end of the input.
    pub async fn rest(mut self) -> Vec<u8> {
        let _ = self.input.read_to_end(&mut self.buf).await;
        self.buf
    }
}

/// A request's records, up to its `end`.
async fn request(r: &mut Reader) -> Option<Vec<(String, Vec<u8>)>> {
    let mut records = Vec::new();
    loop {
        let (name, value) = r.record().await?;
        if name == "end" {
            return Some(records);
        }
        records.push((name, value));
    }
}

fn done(state: &str, extra: &str) -> Vec<u8> {
    frame(
        b'D',
        format!("state={state}\n{extra}workspace_bytes=4096\n").as_bytes(),
    )
}

/// Serve a session's requests until the input ends or the container is removed or killed.
/// Returns the container's exit code and whether it died of an OOM kill recorded as an event.
pub(super) async fn serve(
    state: Arc<Mutex<State>>,
    name: String,
    mut r: Reader,
    out: mpsc::UnboundedSender<Result<Output, EngineError>>,
    signals: &mut mpsc::UnboundedReceiver<Signal>,
) -> (i64, bool) {
    let send = |bytes: Vec<u8>| {
        let _ = out.send(Ok(Output::Stdout(Bytes::from(bytes))));
    };
    send(done("new", ""));
    let mut fresh = true;
    loop {
        let Some(records) = request(&mut r).await else {
            return (0, false);
        };
        lock(&state)
            .session_requests
            .push((name.clone(), records.clone()));
        let has = |k: &str| records.iter().any(|(n, _)| n == k);
        if has("read") {
            let delay = lock(&state).read_delay;
            tokio::time::sleep(delay).await;
            let mut v = frame(
                b'F',
                &["f", "data.txt", "644", "4", "hash", "range 4", ""]
                    .join("\0")
                    .into_bytes(),
            );
            v.extend(frame(b'B', b"fake"));
            v.extend(done("kept", ""));
            send(v);
            continue;
        }
        if has("reset") {
            fresh = true;
        }
        let behaviour = {
            let mut st = lock(&state);
            let default = st.default.clone();
            st.script.pop_front().unwrap_or(default)
        };
        let (slow, behaviour) = match behaviour {
            Behaviour::Slow { after, then } => (after, *then),
            other => (std::time::Duration::ZERO, other),
        };
        let hangs = matches!(behaviour, Behaviour::Hang { .. } | Behaviour::HangHard);
        if !hangs {
            tokio::time::sleep(slow).await;
        }
        let now = if fresh { "new" } else { "kept" };
        let check = |ok: bool, err: &str| {
            let mut v = frame(b'P', b"check");
            if !err.is_empty() {
                v.extend(frame(b'E', err.as_bytes()));
            }
            v.extend(frame(
                b'X',
                format!(
                    "phase=check\nend=exited\ncode={}\nwall_ms=1\ncpu_ms=1\n",
                    u8::from(!ok)
                )
                .as_bytes(),
            ));
            v
        };
        match behaviour {
            Behaviour::Syntax(message) => {
                let mut v = check(false, &message);
                v.extend(done(now, ""));
                send(v);
            }
            Behaviour::Result(text) => {
                let mut v = check(true, "");
                v.extend(phase_end("exited", "", "", "code=0\noom_kills=0\n"));
                v.extend(frame(b'R', text.as_bytes()));
                v.extend(done(now, &format!("result_bytes={}\n", text.len())));
                send(v);
            }
            Behaviour::Exit {
                code,
                stdout,
                stderr,
            } => {
                let mut v = check(true, "");
                v.extend(phase_end(
                    "exited",
                    &stdout,
                    &stderr,
                    &format!("code={code}\noom_kills=0\n"),
                ));
                v.extend(done(now, ""));
                send(v);
            }
            Behaviour::Signal { signal, oom } => {
                let extra = format!("signal={signal}\noom_kills={}\n", u8::from(oom));
                let mut v = phase_end("signaled", "", "", &extra);
                let reason = if oom {
                    "out_of_memory"
                } else {
                    "driver_exited"
                };
                v.extend(done("reset", &format!("reason={reason}\n")));
                send(v);
                fresh = true;
                continue;
            }
            Behaviour::TimedOut { stdout } => {
                let mut v = phase_end("timed_out", &stdout, "", "");
                v.extend(done(now, ""));
                send(v);
            }
            hang @ (Behaviour::Hang { .. } | Behaviour::HangHard) => {
                let mut v = frame(b'P', b"run");
                if let Behaviour::Hang { stdout } = &hang {
                    if !stdout.is_empty() {
                        v.extend(frame(b'O', stdout.as_bytes()));
                    }
                }
                send(v);
                if !matches!(signals.recv().await, Some(Signal::Term)) {
                    return (137, false);
                }
                tokio::time::sleep(slow).await;
                while let Ok(signal) = signals.try_recv() {
                    if signal != Signal::Term {
                        return (137, false);
                    }
                }
                let mut v = frame(
                    b'X',
                    b"phase=run\nend=stopped\nwall_ms=1\ncpu_ms=1\npeak_kb=1024\noom_kills=0\n",
                );
                if hang == Behaviour::HangHard {
                    // The driver did not answer the interrupt: it was started again.
                    v.extend(done("reset", "reason=stopped\n"));
                    send(v);
                    fresh = true;
                    continue;
                }
                v.extend(done(now, ""));
                send(v);
            }
            Behaviour::KilledWhole { oom_event } => {
                send(frame(b'P', b"run"));
                return (137, oom_event);
            }
            Behaviour::Raw(bytes) => send(bytes),
            Behaviour::Slow { .. } => send(done(now, "")),
            Behaviour::Panic => send(frame(b'!', b"the fake was told to panic")),
        }
        fresh = false;
    }
}
