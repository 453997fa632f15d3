//! `codebox repl LANG`: a session (SPEC section 11) in the terminal, through the same run
//! manager as the server. On a terminal a cell ends at an empty line (for python also at a
//! complete one-line statement); with stdin not a terminal the whole input is one cell. Each
//! cell prints its output, its value, and a one-line status. Ctrl-C interrupts the running
//! cell (or drops the cell being typed); Ctrl-D closes the session and removes its container.
//! The session's id is printed first (for `codebox history --session`). A cell's stdin is
//! empty: the terminal is where cells are typed, so `input()` gets end of file.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use anyhow::{anyhow, bail};
use tokio::sync::mpsc;

use crate::app::App;
use crate::contract::{LimitsInput, RunRequest, SessionRequest};
use crate::report::{fmt_num, RunReport, Status};
use crate::runs::SubmitError;
use crate::sessions::SessionInfo;

#[derive(Debug, clap::Args)]
pub struct ReplArgs {
    /// Language id or alias (see `codebox languages`; stateful ones keep variables).
    pub language: String,
    /// Memory of the session, in MB.
    #[arg(long)]
    pub memory_mb: Option<f64>,
    /// Each cell's wall-clock limit, in seconds.
    #[arg(long)]
    pub timeout_seconds: Option<f64>,
    /// CPU of the session, in cores.
    #[arg(long)]
    pub cpus: Option<f64>,
}

/// Whether `line`, the first line of a python cell, is a complete statement on its own: not
/// the head of a block, no bracket or string left open, no line continuation.
fn python_line_is_complete(line: &str) -> bool {
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    let mut code_end = line.len();
    for (at, c) in line.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '#' => {
                    code_end = at;
                    break;
                }
                '\'' | '"' => quote = Some(c),
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => depth -= 1,
                _ => {}
            },
        }
    }
    let code = line[..code_end].trim_end();
    let triple = code.matches("\"\"\"").count() % 2 == 1 || code.matches("\'\'\'").count() % 2 == 1;
    !code.is_empty()
        && !code.ends_with(':')
        && !code.ends_with('\\')
        && !code.starts_with('@')
        && !triple
        && depth <= 0
        && quote.is_none()
}

/// Lines of stdin, read on a thread of their own (reading blocks); `None` at the end.
fn stdin_lines() -> mpsc::UnboundedReceiver<String> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// One line of status after a cell.
fn status_line(r: &RunReport) -> String {
    let mut s = format!(
        "[{} in {} s",
        r.status,
        fmt_num((r.duration_ms as f64 / 10.0).round() / 100.0)
    );
    if !matches!(r.status, Status::Succeeded) {
        s.push_str(&format!(": {}", r.message));
    }
    if let Some(x) = &r.session {
        s.push_str(&format!("; #{} state {:?}", x.execution_count, x.state).to_lowercase());
        if let Some(reason) = x.reset_reason {
            s.push_str(&format!(" ({})", reason.as_str()));
        }
    }
    s.push(']');
    s
}

/// Run one cell, interrupted by Ctrl-C; print what it did.
async fn run_cell(
    app: &App,
    session: &SessionInfo,
    code: String,
    timeout: Option<f64>,
) -> anyhow::Result<RunReport> {
    let req = RunRequest {
        code,
        session_id: Some(session.session_id.clone()),
        limits: timeout.map(|t| LimitsInput {
            timeout_seconds: Some(t),
            ..Default::default()
        }),
        ..Default::default()
    };
    let accepted = app.sessions.submit(req).map_err(|e| match e {
        SubmitError::Invalid(e) => anyhow!("invalid argument {e}"),
        other => anyhow!(other),
    })?;
    let id = accepted.run_id;
    let report = loop {
        tokio::select! {
            r = app.runs.wait(&id, Duration::from_secs(60)) => {
                let r = r?;
                if r.status.is_terminal() {
                    break r;
                }
            }
            _ = tokio::signal::ctrl_c() => {
                break app.runs.stop(&id).await?;
            }
        }
    };
    if let Some(c) = report
        .compile
        .as_ref()
        .filter(|_| report.status == Status::CompileError)
    {
        eprint!("{}{}", c.stdout, c.stderr);
    }
    print!("{}", report.stdout);
    if let Some(v) = &report.result {
        println!("{v}");
    }
    std::io::stdout().flush()?;
    eprint!("{}", report.stderr);
    for f in &report.files {
        eprintln!(
            "codebox: {} ({} bytes) is in the session; read it with read_session_file",
            f.path, f.size_bytes
        );
    }
    eprintln!("{}", status_line(&report));
    Ok(report)
}

pub async fn repl(app: &App, args: ReplArgs) -> anyhow::Result<i32> {
    if let Ok(info) = app.engine.ping().await {
        super::check_runtimes(app, &info)?;
        app.reap().await;
        if let Some(lang) = app.registry.resolve(&args.language) {
            super::images::ensure(app, lang).await?;
        }
    }
    let session = app
        .sessions
        .create(SessionRequest {
            language: args.language.clone(),
            limits: Some(LimitsInput {
                memory_mb: args.memory_mb,
                cpus: args.cpus,
                timeout_seconds: None,
            }),
            ..Default::default()
        })
        .await
        .map_err(|e| anyhow!(e))?;
    let python = session.language == "python";
    let terminal = std::io::stdin().is_terminal();
    let mut lines = stdin_lines();
    // The id, so that the session's executions can be found: `codebox history --session`.
    eprintln!(
        "codebox repl: session {} ({}, {}, {} MB)",
        session.session_id,
        session.language,
        if session.stateful {
            "state kept"
        } else {
            "files kept"
        },
        session.limits.memory_mb,
    );
    let code = if terminal {
        eprintln!(
            "A cell ends at an empty line{}. A cell's stdin is empty (input() gets end of file). Ctrl-C interrupts, Ctrl-D ends.",
            if python { " or a complete one-line statement" } else { "" }
        );
        interactive(app, &session, &mut lines, python, args.timeout_seconds).await
    } else {
        let mut all = Vec::new();
        while let Some(line) = lines.recv().await {
            all.push(line);
        }
        if all.iter().all(|l| l.trim().is_empty()) {
            bail!("stdin held no code");
        }
        let report = run_cell(app, &session, all.join("\n") + "\n", args.timeout_seconds).await;
        report.map(|r| super::exit_status(&r))
    };
    let _ = app.sessions.close_removed(&session.session_id).await;
    if terminal {
        eprintln!(
            "codebox repl: session {} closed; its executions: codebox history --session {}",
            session.session_id,
            session.session_id.get(..12).unwrap_or(&session.session_id)
        );
    }
    code
}

async fn interactive(
    app: &App,
    session: &SessionInfo,
    lines: &mut mpsc::UnboundedReceiver<String>,
    python: bool,
    timeout: Option<f64>,
) -> anyhow::Result<i32> {
    let mut cell: Vec<String> = Vec::new();
    loop {
        eprint!("{}", if cell.is_empty() { ">>> " } else { "... " });
        let line = tokio::select! {
            line = lines.recv() => line,
            _ = tokio::signal::ctrl_c() => {
                eprintln!("\nKeyboardInterrupt");
                cell.clear();
                continue;
            }
        };
        let Some(line) = line else {
            eprintln!();
            if !cell.is_empty() {
                run_cell(app, session, cell.join("\n") + "\n", timeout).await?;
            }
            return Ok(0);
        };
        let ends = if cell.is_empty() {
            python && python_line_is_complete(&line)
        } else {
            line.trim().is_empty()
        };
        if !(cell.is_empty() && line.trim().is_empty()) {
            cell.push(line);
        }
        if ends && !cell.is_empty() {
            let code = std::mem::take(&mut cell).join("\n") + "\n";
            run_cell(app, session, code, timeout).await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::python_line_is_complete;

    #[test]
    fn a_python_cell_ends_at_a_complete_one_line_statement() {
        for complete in [
            "x = 1",
            "print(x)",
            "import os",
            "f(a, [1, 2])",
            "s = 'a:('  # note:",
            "x",
        ] {
            assert!(python_line_is_complete(complete), "{complete}");
        }
        for open in [
            "def f():",
            "for i in range(3):",
            "f(1,",
            "x = [",
            "@decorator",
            "s = '''",
            "a = 1 + \\",
            "",
        ] {
            assert!(!python_line_is_complete(open), "{open}");
        }
    }
}
