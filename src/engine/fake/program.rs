//! The fake's `codebox-init` for one run's stage: it reads the payload, then acts out the
//! scripted [`Behaviour`] (the frames of a phase that ended, files back from a compile stage).

use super::*;

/// The frames of a run phase that ended (`extra`: more `key=value` lines).
pub(super) fn phase_end(end: &str, stdout: &str, stderr: &str, extra: &str) -> Vec<u8> {
    phase_frames("run", end, stdout, stderr, extra)
}

/// The frames of phase `phase` that ended.
fn phase_frames(phase: &str, end: &str, stdout: &str, stderr: &str, extra: &str) -> Vec<u8> {
    let mut v = frame(b'P', phase.as_bytes());
    if !stdout.is_empty() {
        v.extend(frame(b'O', stdout.as_bytes()));
    }
    if !stderr.is_empty() {
        v.extend(frame(b'E', stderr.as_bytes()));
    }
    v.extend(frame(
        b'X',
        format!(
            "phase={phase}\nend={end}\n{extra}wall_ms=1\ncpu_ms=1\npeak_kb=1024\npeak_source=cgroup\nstdout_bytes={}\nstderr_bytes={}\n",
            stdout.len(),
            stderr.len()
        )
        .as_bytes(),
    ));
    v
}

/// The working directory sent back by a compile stage: the payload's entries and a `main`.
fn workspace_frames(payload: &Payload) -> Vec<u8> {
    let mut v = Vec::new();
    let mut entries = Vec::new();
    // An install step's package manager: each `name==version` it is given leaves its package
    // and its metadata in the prefix.
    for (name, version) in payload
        .run
        .iter()
        .flatten()
        .filter_map(|a| a.split_once("=="))
    {
        for path in [
            format!("{name}/__init__.py"),
            format!("{name}-{version}.dist-info/METADATA"),
        ] {
            entries.push(crate::engine::protocol::Entry::file(
                &path,
                0o644,
                Bytes::from(format!("{name} {version}\n")),
            ));
        }
    }
    entries.extend(payload.files.entries());
    entries.push(crate::engine::protocol::Entry::file(
        "main",
        0o755,
        Bytes::from_static(b"\x7fELF fake binary"),
    ));
    for e in entries {
        let (kind, size) = match e.kind {
            EntryKind::File => ("f", e.content.len()),
            EntryKind::Dir => ("d", 0),
            EntryKind::Link => ("l", 0),
        };
        v.extend(frame(
            b'F',
            format!("{kind}\0{}\0{:o}\0{size}\0\0\0{}", e.path, e.mode, e.target).as_bytes(),
        ));
        if size > 0 {
            v.extend(frame(b'B', &e.content));
        }
    }
    v
}

/// Play `codebox-init`: read the payload, then act out the behaviour.
pub(super) async fn program(
    state: Arc<Mutex<State>>,
    name: String,
    input: tokio::io::DuplexStream,
    out: mpsc::UnboundedSender<Result<Output, EngineError>>,
    mut signals: mpsc::UnboundedReceiver<Signal>,
    behaviour: Behaviour,
) {
    // Records as they arrive: a `session` record turns the container into a session's.
    let mut reader = session::Reader::new(input);
    let mut is_session = false;
    if reader.line().await.is_some() {
        while let Some((name, _)) = reader.record().await {
            is_session |= name == "session";
            if name == "end" {
                break;
            }
        }
    }
    if is_session {
        let (code, oom_event) =
            session::serve(state.clone(), name.clone(), reader, out, &mut signals).await;
        let mut st = lock(&state);
        if let Some(c) = st.containers.get_mut(&name) {
            c.oom_event = oom_event;
            c.exit.send_replace(Some(code));
        }
        return;
    }
    let raw = reader.rest().await;
    let payload = parse_payload(&raw);
    let send = |bytes: Vec<u8>| {
        let _ = out.send(Ok(Output::Stdout(Bytes::from(bytes))));
    };
    let (code, oom) = match (&payload, behaviour) {
        (None, _) => {
            send(frame(b'!', b"not a payload"));
            (125, false)
        }
        (
            Some(p),
            Behaviour::Exit {
                code,
                stdout,
                stderr,
            },
        ) => {
            let mut v = phase_end(
                "exited",
                &stdout,
                &stderr,
                &format!("code={code}\noom_kills=0\n"),
            );
            if code == 0 && matches!(p.collect, Some(Collect::WorkspaceOnSuccess { .. })) {
                v.extend(workspace_frames(p));
            }
            v.extend(frame(b'Z', b""));
            send(v);
            (0, false)
        }
        (Some(_), Behaviour::Signal { signal, oom }) => {
            let extra = format!("signal={signal}\noom_kills={}\n", u8::from(oom));
            let mut v = phase_end("signaled", "", "", &extra);
            v.extend(frame(b'Z', b""));
            send(v);
            (0, oom)
        }
        (Some(_), Behaviour::TimedOut { stdout }) => {
            let mut v = phase_end("timed_out", &stdout, "", "");
            v.extend(frame(b'Z', b""));
            send(v);
            (0, false)
        }
        (Some(_), Behaviour::Raw(bytes)) => {
            send(bytes);
            (0, false)
        }
        (Some(_), Behaviour::KilledWhole { oom_event }) => {
            send(frame(b'P', b"run"));
            if let Some(c) = lock(&state).containers.get_mut(&name) {
                c.oom_event = oom_event;
            }
            (137, false)
        }
        (Some(_), hang @ (Behaviour::Hang { .. } | Behaviour::HangHard)) => {
            let mut v = frame(b'P', b"run");
            if let Behaviour::Hang { stdout } = &hang {
                if !stdout.is_empty() {
                    v.extend(frame(b'O', stdout.as_bytes()));
                }
            }
            send(v);
            loop {
                match signals.recv().await {
                    Some(Signal::Term) if hang != Behaviour::HangHard => {
                        let mut v = frame(
                            b'X',
                            b"phase=run\nend=stopped\nwall_ms=1\ncpu_ms=1\npeak_kb=1024\noom_kills=0\n",
                        );
                        v.extend(frame(b'Z', b""));
                        send(v);
                        break (0, false);
                    }
                    Some(Signal::Term) => continue,
                    Some(Signal::Kill) | None => break (137, false),
                }
            }
        }
        (Some(_), Behaviour::Panic) => unreachable!("panics at attach"),
        (Some(p), Behaviour::Syntax(message)) if p.check.is_some() || p.check_in_run => {
            // The check fails: its phase, then no program.
            let mut v = phase_frames("check", "exited", "", &message, "code=1\noom_kills=0\n");
            v.extend(frame(b'Z', b""));
            send(v);
            (0, false)
        }
        (Some(_), Behaviour::Syntax(_) | Behaviour::Result(_) | Behaviour::Slow { .. }) => {
            send(frame(b'!', b"a session's behaviour in a run"));
            (125, false)
        }
    };
    let mut st = lock(&state);
    if let Some(p) = &payload {
        st.payloads.push((name.clone(), p.clone()));
    }
    if let Some(c) = st.containers.get_mut(&name) {
        c.oom = oom;
        c.exit.send_replace(Some(code));
    }
}
