//! A run report as Judge0 answers a submission: status ids, tokens, fields.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{json, Map, Value};

use super::store::Submission;
use super::{CODEBOX_STATUS, STATUSES};
use crate::api::Api;
use crate::executor::outcome::signal_name;
use crate::report::{RunReport, Stage, Status};

/// Judge0's trimming before comparing with `expected_output`: each line's trailing
/// whitespace, then the whole text's.
pub fn judge0_strip(text: &str) -> String {
    text.split('\n')
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

/// A run's Judge0 status id, from its report and the expected output.
pub fn status_of(r: &RunReport, expected: Option<&str>) -> u8 {
    match r.status {
        Status::Queued => 1,
        Status::Running => 2,
        Status::CompileError => 6,
        Status::TimedOut | Status::OutOfMemory if r.stage == Some(Stage::Compile) => 6,
        Status::Succeeded => match expected {
            Some(e) if judge0_strip(e) != judge0_strip(&r.stdout) => 4,
            _ => 3,
        },
        Status::TimedOut => 5,
        Status::Failed => match r.signal.as_deref() {
            None => 11,
            Some("SIGSEGV") => 7,
            Some("SIGXFSZ") => 8,
            Some("SIGFPE") => 9,
            Some("SIGABRT") => 10,
            Some(_) => 12,
        },
        Status::OutOfMemory => 12,
        Status::Stopped | Status::SandboxError => 13,
    }
}

/// A run id as a hyphenated UUID.
pub fn token_of(run_id: &str) -> String {
    uuid::Uuid::parse_str(run_id)
        .map(|u| u.hyphenated().to_string())
        .unwrap_or_else(|_| run_id.to_string())
}

fn seconds(ms: Option<u64>) -> Value {
    ms.map_or(Value::Null, |ms| {
        json!(format!("{:.3}", ms as f64 / 1000.0))
    })
}

fn decimal(v: f64) -> Value {
    json!(format!("{v:.1}"))
}

/// A submission as Judge0 answers it: `fields` only, text fields base64 when asked.
pub(super) fn render(
    api: &Api,
    r: &RunReport,
    sub: Option<&Submission>,
    fields: &[&str],
    base64: bool,
) -> Value {
    let registry = api.manager().registry();
    let lang = registry.resolve(&r.language);
    let language_id = sub
        .map(|s| s.language_id)
        .or_else(|| lang.and_then(|l| l.judge0_ids.first().copied()));
    let status = status_of(r, sub.and_then(|s| s.expected_output.as_deref()));
    let description = STATUSES
        .iter()
        .find(|(id, _)| *id == status)
        .map_or("", |(_, d)| *d);
    let finished = r.status.is_terminal();
    let ran = finished && status != 6;
    let text = |s: Option<String>| -> Value {
        match s.filter(|s| !s.is_empty()) {
            None => Value::Null,
            Some(s) if base64 => json!(base64::engine::general_purpose::STANDARD.encode(s)),
            Some(s) => json!(s),
        }
    };
    let redirect = sub.is_some_and(|s| s.redirect_stderr_to_stdout);
    let (stdout, stderr) = if redirect {
        (format!("{}{}", r.stdout, r.stderr), String::new())
    } else {
        (r.stdout.clone(), r.stderr.clone())
    };
    let compile_output = r.compile.as_ref().map(|c| {
        if r.stage == Some(Stage::Compile) && r.status == Status::TimedOut {
            "Compilation time limit exceeded.".to_string()
        } else {
            format!("{}{}", c.stdout, c.stderr)
        }
    });
    let killed = matches!(
        r.status,
        Status::TimedOut | Status::OutOfMemory | Status::Stopped
    );
    let signal = r
        .signal
        .as_deref()
        .or(killed.then_some("SIGKILL"))
        .and_then(|name| (1..=64).find(|n| signal_name(*n) == Some(name)));
    let compile_ms = r.compile.as_ref().map_or(0, |c| c.duration_ms);
    let c = api.manager().config();
    let d = c.limits.defaults();
    let created = sub.map(|s| s.created_at);
    let at =
        |t: chrono::DateTime<chrono::Utc>| json!(t.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
    let mut all: BTreeMap<&str, Value> = BTreeMap::new();
    all.insert("source_code", text(sub.map(|s| s.source_code.clone())));
    all.insert("language_id", json!(language_id));
    all.insert("stdin", text(sub.and_then(|s| s.stdin.clone())));
    all.insert(
        "expected_output",
        text(sub.and_then(|s| s.expected_output.clone())),
    );
    all.insert("stdout", if ran { text(Some(stdout)) } else { Value::Null });
    all.insert("status_id", json!(status));
    all.insert("created_at", created.map_or(Value::Null, at));
    all.insert(
        "finished_at",
        match (created, finished) {
            (Some(t), true) => at(t + chrono::Duration::milliseconds(
                (r.queued_ms + r.duration_ms).min(i64::MAX as u64) as i64,
            )),
            _ => Value::Null,
        },
    );
    all.insert(
        "time",
        if ran {
            seconds(r.usage.cpu_time_ms)
        } else {
            Value::Null
        },
    );
    all.insert(
        "memory",
        if ran {
            json!(r.usage.peak_memory_kb)
        } else {
            Value::Null
        },
    );
    all.insert("stderr", if ran { text(Some(stderr)) } else { Value::Null });
    all.insert("token", json!(token_of(&r.run_id)));
    all.insert("number_of_runs", json!(1));
    all.insert(
        "cpu_time_limit",
        decimal(sub.map_or(d.timeout_seconds, |s| s.cpu_time_limit)),
    );
    all.insert(
        "cpu_extra_time",
        decimal(sub.map_or(0.0, |s| s.cpu_extra_time)),
    );
    all.insert(
        "wall_time_limit",
        decimal(sub.map_or(r.limits.timeout_seconds, |s| s.wall_time_limit)),
    );
    all.insert(
        "memory_limit",
        json!(sub.map_or(r.limits.memory_mb as i64 * 1024, |s| s.memory_limit)),
    );
    all.insert(
        "stack_limit",
        json!(sub.map_or(d.memory_mb as i64 * 1024, |s| s.stack_limit)),
    );
    all.insert(
        "max_processes_and_or_threads",
        json!(sub.map_or(c.sandbox.pids_limit, |s| s.max_processes_and_or_threads)),
    );
    all.insert("enable_per_process_and_thread_time_limit", json!(false));
    all.insert("enable_per_process_and_thread_memory_limit", json!(false));
    all.insert(
        "max_file_size",
        json!(sub.map_or(c.sandbox.max_file_size_mb as i64 * 1024, |s| s
            .max_file_size)),
    );
    all.insert("compile_output", text(compile_output));
    all.insert(
        "exit_code",
        if ran {
            json!(if signal.is_some() {
                0
            } else {
                r.exit_code.unwrap_or(0)
            })
        } else {
            Value::Null
        },
    );
    all.insert("exit_signal", if ran { json!(signal) } else { Value::Null });
    all.insert(
        "message",
        if ran && !matches!(status, 3 | 4) {
            text(Some(r.message.clone()))
        } else {
            Value::Null
        },
    );
    all.insert(
        "wall_time",
        if ran {
            seconds(Some(r.duration_ms.saturating_sub(compile_ms)))
        } else {
            Value::Null
        },
    );
    all.insert("compiler_options", Value::Null);
    all.insert(
        "command_line_arguments",
        json!(sub.and_then(|s| s.command_line_arguments.clone())),
    );
    all.insert("redirect_stderr_to_stdout", json!(redirect));
    all.insert("callback_url", Value::Null);
    all.insert("additional_files", Value::Null);
    all.insert("enable_network", json!(false));
    all.insert(
        "status",
        json!({ "id": status, "description": description }),
    );
    all.insert(
        "language",
        json!({ "id": language_id, "name": lang.map(|l| l.display_name.clone()) }),
    );
    all.insert(CODEBOX_STATUS, json!(r.status));
    let mut out = Map::new();
    for f in fields {
        if let Some(v) = all.remove(f) {
            out.insert(f.to_string(), v);
        }
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge0_trims_each_line_and_the_end() {
        assert_eq!(judge0_strip("a  \nb\t\n\n"), "a\nb");
        assert_eq!(judge0_strip("a\r\nb"), "a\nb");
        assert_ne!(judge0_strip(" a"), judge0_strip("a"));
    }

    #[test]
    fn tokens_are_hyphenated_and_both_forms_name_the_run() {
        use crate::contract::ids::run_id_of;
        let run = "0123456789abcdef0123456789abcdef";
        let token = token_of(run);
        assert_eq!(token, "01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(run_id_of(&token).as_deref(), Some(run));
        assert_eq!(run_id_of(run).as_deref(), Some(run));
        assert_eq!(run_id_of(&token.to_uppercase()).as_deref(), Some(run));
        assert_eq!(run_id_of("nope"), None);
        assert_eq!(run_id_of("{01234567-89ab-cdef-0123-456789abcdef}"), None);
    }

    #[test]
    fn statuses_follow_judge0s_ids() {
        let limits = crate::report::RunLimits {
            memory_mb: 64,
            timeout_seconds: 1.0,
            cpus: 1.0,
        };
        let report = |status, stage, signal: Option<&str>, stdout: &str| {
            let mut r = RunReport::new("r", "c", status, limits, "");
            r.stage = stage;
            r.signal = signal.map(str::to_string);
            r.stdout = stdout.to_string();
            r
        };
        let run = Some(Stage::Run);
        let compile = Some(Stage::Compile);
        for (r, expected, id) in [
            (report(Status::Queued, None, None, ""), None, 1),
            (report(Status::Running, None, None, ""), None, 2),
            (report(Status::Succeeded, run, None, "42\n"), None, 3),
            (
                report(Status::Succeeded, run, None, "42 \n\n"),
                Some("42"),
                3,
            ),
            (report(Status::Succeeded, run, None, "41\n"), Some("42"), 4),
            (report(Status::TimedOut, run, None, ""), None, 5),
            (report(Status::CompileError, compile, None, ""), None, 6),
            (report(Status::TimedOut, compile, None, ""), None, 6),
            (report(Status::OutOfMemory, compile, None, ""), None, 6),
            (report(Status::Failed, run, Some("SIGSEGV"), ""), None, 7),
            (report(Status::Failed, run, Some("SIGXFSZ"), ""), None, 8),
            (report(Status::Failed, run, Some("SIGFPE"), ""), None, 9),
            (report(Status::Failed, run, Some("SIGABRT"), ""), None, 10),
            (report(Status::Failed, run, None, ""), None, 11),
            (report(Status::Failed, run, Some("SIGTERM"), ""), None, 12),
            (report(Status::OutOfMemory, run, None, ""), None, 12),
            (report(Status::SandboxError, run, None, ""), None, 13),
        ] {
            assert_eq!(status_of(&r, expected), id, "{:?} {:?}", r.status, r.stage);
        }
    }
}
