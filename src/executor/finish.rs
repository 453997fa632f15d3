//! The run report, built once from what the stages found.

use super::cases;
use super::ends::{Ended, Known};
use super::outcome::Outcome;
use super::outputs;
use super::packages::InstallEnd;
use crate::contract::ValidRequest;
use crate::report::{fmt_num, PackagesReport, RunReport, Stage, Status};

/// The report of a run, built once from what its stages found.
pub(super) fn report(run_id: &str, req: &ValidRequest, known: Known, ended: Ended) -> RunReport {
    let mut r = RunReport::new(
        run_id,
        req.language.id.clone(),
        Status::Running,
        req.limits,
        "",
    );
    r.stage = known.stage;
    r.image_id = known.image_id;
    r.compile = known.compile;
    r.packages = known.packages;
    match ended {
        Ended::AtInstall(InstallEnd::Failed {
            status,
            message,
            exit_code,
            stdout,
            stderr,
            usage,
            install_ms,
        }) => {
            r.stage = Some(Stage::Install);
            r.status = status;
            r.message = message;
            r.exit_code = exit_code;
            r.stdout_bytes = stdout.len() as u64;
            r.stderr_bytes = stderr.len() as u64;
            r.stdout = stdout;
            r.stderr = stderr;
            r.usage = usage;
            r.packages = Some(PackagesReport {
                requested: req.packages.clone(),
                installed: Vec::new(),
                cached: false,
                install_ms,
            });
        }
        Ended::AtInstall(InstallEnd::Stopped) => {
            r.stage = Some(Stage::Install);
            r.status = Status::Stopped;
            r.message = "stopped while the packages were being installed".into();
        }
        Ended::AtInstall(InstallEnd::Sandbox(m)) => {
            r.stage = Some(Stage::Install);
            r.status = Status::SandboxError;
            r.message = format!("installing the packages failed: {m}");
        }
        Ended::AtCompile(c) => {
            r.stage = Some(Stage::Compile);
            r.status = c.status;
            r.exit_code = c.exit_code;
            r.signal = c.signal;
            r.message = c.message;
        }
        Ended::Ran {
            outcome,
            streams,
            files,
            result,
        } => {
            if let Some((text, truncated)) = result {
                r.result = Some(text);
                r.result_truncated = truncated;
            }
            r.message = outputs::with_unlisted_note(run_message(&outcome, req), &files);
            r.status = outcome.status;
            r.exit_code = outcome.exit_code;
            r.signal = outcome.signal;
            r.usage = outcome.usage;
            r.stdout_truncated = streams.stdout_truncated();
            r.stderr_truncated = streams.stderr_truncated();
            r.stdout = streams.stdout;
            r.stderr = streams.stderr;
            r.stdout_bytes = streams.stdout_bytes;
            r.stderr_bytes = streams.stderr_bytes;
            r.files = files;
        }
        Ended::Cases(cases) => cases::summarise(&mut r, cases),
        Ended::Stopped => {
            r.status = Status::Stopped;
            r.message = "stopped before the program ran".into();
        }
        Ended::Failed(f) => {
            r.status = Status::SandboxError;
            r.message = f.to_string();
        }
    }
    r
}

/// One sentence on how a program ended.
fn run_message(o: &Outcome, req: &ValidRequest) -> String {
    match (o.status, &o.problem) {
        (Status::SandboxError, Some(problem)) => problem.clone(),
        (Status::Succeeded, _) => "exited with code 0".to_string(),
        (Status::Stopped, _) => "stopped before it finished".to_string(),
        (Status::TimedOut, _) => format!(
            "killed at the {} s wall-clock limit",
            fmt_num(req.limits.timeout_seconds)
        ),
        (Status::OutOfMemory, _) => format!(
            "killed by the out-of-memory killer at the {} MB memory limit",
            req.limits.memory_mb
        ),
        _ => match (&o.signal, o.exit_code) {
            (Some(sig), _) => format!("killed by {sig}"),
            (None, Some(code)) => format!("exited with code {code}"),
            (None, None) => "ended without an exit code".to_string(),
        },
    }
}
