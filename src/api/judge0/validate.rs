//! A submission checked as Judge0 checks it (422 `{field: [messages]}`), and turned into a
//! run.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde_json::{Map, Value};

use super::store::Submission;
use crate::api::Api;
use crate::contract::{LimitsInput, RunRequest};

/// Judge0's longest `compiler_options` and `command_line_arguments`.
const MAX_OPTION_CHARS: usize = 512;

/// Judge0's validation errors: `{field: [messages]}`.
pub(super) type Errors = BTreeMap<String, Vec<String>>;

pub(super) fn add(errors: &mut Errors, field: &str, message: impl Into<String>) {
    errors
        .entry(field.to_string())
        .or_default()
        .push(message.into());
}

/// A request's fields, read as loosely as Rails reads them (numbers may be strings).
struct Fields<'a> {
    map: &'a Map<String, Value>,
    errors: Errors,
}

impl Fields<'_> {
    fn text(&mut self, field: &str) -> Option<String> {
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Number(n)) => Some(n.to_string()),
            Some(_) => {
                add(&mut self.errors, field, "must be a string");
                None
            }
        }
    }

    fn number(&mut self, field: &str) -> Option<f64> {
        let v = match self.map.get(field) {
            None | Some(Value::Null) => return None,
            Some(Value::Number(n)) => n.as_f64(),
            Some(Value::String(s)) if s.trim().is_empty() => return None,
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            Some(_) => None,
        };
        match v.filter(|v| v.is_finite()) {
            Some(v) => Some(v),
            None => {
                add(&mut self.errors, field, "is not a number");
                None
            }
        }
    }

    fn boolean(&mut self, field: &str) -> Option<bool> {
        match self.map.get(field) {
            None | Some(Value::Null) => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(Value::String(s)) if s == "true" || s == "1" => Some(true),
            Some(Value::String(s)) if s == "false" || s == "0" || s.is_empty() => Some(false),
            Some(_) => {
                add(&mut self.errors, field, "must be true or false");
                None
            }
        }
    }

    /// A number within `min..=max` (`min_exclusive`: above `min`), else the default.
    fn bounded(
        &mut self,
        field: &str,
        min: f64,
        min_exclusive: bool,
        max: f64,
        default: f64,
    ) -> (f64, bool) {
        let Some(v) = self.number(field) else {
            return (default, false);
        };
        if min_exclusive && v <= min {
            add(
                &mut self.errors,
                field,
                format!("must be greater than {}", num(min)),
            );
        } else if !min_exclusive && v < min {
            add(
                &mut self.errors,
                field,
                format!("must be greater than or equal to {}", num(min)),
            );
        } else if v > max {
            add(
                &mut self.errors,
                field,
                format!("must be less than or equal to {}", num(max)),
            );
        }
        (v, true)
    }

    /// A text field, base64-decoded when the request says so.
    fn content(&mut self, field: &str, base64: bool) -> Option<String> {
        let text = self.text(field)?;
        if !base64 {
            return Some(text);
        }
        let cleaned: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        let engine = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new()
                .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
        );
        match engine.decode(cleaned.as_bytes()) {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(s) => Some(s),
                Err(_) => {
                    add(&mut self.errors, field, "is not UTF-8 text once decoded");
                    None
                }
            },
            Err(e) => {
                add(
                    &mut self.errors,
                    field,
                    format!("is not valid Base64 (base64_encoded=true): {e}"),
                );
                None
            }
        }
    }
}

/// A number as Rails writes it in messages (`15`, `0.5`).
fn num(v: f64) -> String {
    crate::report::fmt_num(v)
}

/// A submission that passed validation, and the run it becomes.
pub(super) struct Valid {
    pub submission: Submission,
    pub run: RunRequest,
    /// Whether the timeout came from `wall_time_limit` (else from the CPU time limit).
    pub wall_given: bool,
}

/// Validate a submission as Judge0 does, and turn it into a run.
pub(super) fn validate(api: &Api, value: &Value, base64: bool) -> Result<Valid, Errors> {
    let Some(map) = value.as_object() else {
        let mut errors = Errors::new();
        add(&mut errors, "submission", "must be a JSON object");
        return Err(errors);
    };
    let c = api.manager().config();
    let (d, m) = (c.limits.defaults(), c.ceilings());
    let max_memory_kb = (m.memory_mb * 1024) as f64;
    let file_kb = (c.sandbox.max_file_size_mb * 1024) as f64;
    let pids = c.sandbox.pids_limit as f64;
    let mut f = Fields {
        map,
        errors: Errors::new(),
    };
    let source_code = f.content("source_code", base64);
    let stdin = f.content("stdin", base64);
    let expected_output = f.content("expected_output", base64);
    if source_code.as_deref().is_none_or(|s| s.trim().is_empty())
        && !f.errors.contains_key("source_code")
    {
        add(&mut f.errors, "source_code", "can't be blank");
    }
    let language = match f.number("language_id") {
        None if !f.errors.contains_key("language_id") => {
            add(&mut f.errors, "language_id", "can't be blank");
            None
        }
        None => None,
        Some(n) => {
            let found = (n.fract() == 0.0)
                .then(|| api.manager().registry().by_judge0_id(n as i64))
                .flatten();
            if found.is_none() {
                add(
                    &mut f.errors,
                    "language_id",
                    format!("language with id {} doesn't exist", num(n)),
                );
            }
            found.map(|l| (n as u32, l))
        }
    };
    f.bounded("number_of_runs", 0.0, true, 1.0, 1.0);
    let (cpu, cpu_given) = f.bounded(
        "cpu_time_limit",
        0.0,
        false,
        m.timeout_seconds,
        d.timeout_seconds,
    );
    let (extra, extra_given) = f.bounded("cpu_extra_time", 0.0, false, m.timeout_seconds, 0.0);
    let (wall, wall_given) = f.bounded(
        "wall_time_limit",
        1.0,
        false,
        m.timeout_seconds,
        d.timeout_seconds,
    );
    let (memory_kb, memory_given) = f.bounded(
        "memory_limit",
        6144.0,
        false,
        max_memory_kb,
        (d.memory_mb * 1024) as f64,
    );
    let (stack, _) = f.bounded(
        "stack_limit",
        0.0,
        false,
        max_memory_kb,
        (d.memory_mb * 1024) as f64,
    );
    let (processes, _) = f.bounded("max_processes_and_or_threads", 0.0, true, pids, pids);
    let (file_size, _) = f.bounded("max_file_size", 0.0, false, file_kb, file_kb);
    for field in [
        "enable_per_process_and_thread_time_limit",
        "enable_per_process_and_thread_memory_limit",
    ] {
        if f.boolean(field) == Some(true) {
            add(&mut f.errors, field, "this option cannot be enabled");
        }
    }
    let redirect = f.boolean("redirect_stderr_to_stdout").unwrap_or(false);
    if f.boolean("enable_network") == Some(true) {
        add(
            &mut f.errors,
            "enable_network",
            "enabling network is not allowed",
        );
    }
    for (field, refused) in [
        (
            "compiler_options",
            "setting compiler options is not allowed",
        ),
        ("callback_url", "setting callback is not allowed"),
        (
            "additional_files",
            "setting additional files is not allowed",
        ),
    ] {
        let given = f.text(field).filter(|t| !t.trim().is_empty());
        if let Some(t) = given {
            if field == "compiler_options" && t.chars().count() > MAX_OPTION_CHARS {
                add(
                    &mut f.errors,
                    field,
                    "is too long (maximum is 512 characters)",
                );
            }
            add(&mut f.errors, field, refused);
        }
    }
    let arguments = f.text("command_line_arguments");
    if arguments
        .as_ref()
        .is_some_and(|a| a.chars().count() > MAX_OPTION_CHARS)
    {
        add(
            &mut f.errors,
            "command_line_arguments",
            "is too long (maximum is 512 characters)",
        );
    }
    let errors = f.errors;
    let (Some((language_id, lang)), Some(source_code), true) =
        (language, source_code, errors.is_empty())
    else {
        return Err(errors);
    };
    // wall_time_limit sets the run's timeout; without it, cpu_time_limit plus cpu_extra_time.
    let timeout = if wall_given {
        Some(wall)
    } else if cpu_given || extra_given {
        Some(cpu + extra)
    } else {
        None
    };
    let args: Vec<String> = arguments
        .as_deref()
        .unwrap_or("")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let run = RunRequest {
        language: lang.id.clone(),
        code: source_code.clone(),
        stdin: stdin.clone(),
        args: (!args.is_empty()).then_some(args),
        limits: Some(LimitsInput {
            memory_mb: memory_given.then(|| (memory_kb / 1024.0).floor()),
            timeout_seconds: timeout,
            cpus: None,
        }),
        ..RunRequest::default()
    };
    Ok(Valid {
        submission: Submission {
            language_id,
            source_code,
            stdin,
            expected_output,
            cpu_time_limit: cpu,
            cpu_extra_time: extra,
            wall_time_limit: wall,
            memory_limit: memory_kb as i64,
            stack_limit: stack as i64,
            max_processes_and_or_threads: processes as i64,
            max_file_size: file_size as i64,
            command_line_arguments: arguments,
            redirect_stderr_to_stdout: redirect,
            created_at: chrono::Utc::now(),
        },
        run,
        wall_given,
    })
}
