//! `codebox run FILE`: one run through the same run manager as the server (so it is recorded
//! in the history), its output printed, its status mirrored in the exit code.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::app::App;
use crate::contract::{LimitsInput, RunRequest};
use crate::report::{RunReport, Status};
use crate::runs::SubmitError;

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The program's source file, or `-` to read the program from standard input (then
    /// `--language` is required).
    pub file: PathBuf,
    /// Language id or alias (default: guessed from the file's extension).
    #[arg(long, short)]
    pub language: Option<String>,
    /// File whose content is the program's standard input.
    #[arg(long)]
    pub stdin: Option<PathBuf>,
    /// Memory limit in MB (the help shows the configured default and maximum).
    #[arg(long, allow_negative_numbers = true)]
    pub memory_mb: Option<f64>,
    /// Wall-clock limit in seconds.
    #[arg(long, allow_negative_numbers = true)]
    pub timeout_seconds: Option<f64>,
    /// CPU quota in cores.
    #[arg(long, allow_negative_numbers = true)]
    pub cpus: Option<f64>,
    /// Print the run report as JSON instead of the program's output.
    #[arg(long)]
    pub json: bool,
    /// Write the files the program leaves under `outputs/` into this folder.
    #[arg(long, value_name = "DIR")]
    pub outputs: Option<PathBuf>,
    /// Arguments passed to the program.
    #[arg(last = true)]
    pub args: Vec<String>,
}

/// Exit status of `codebox run` for a report: the program's own where it has one.
pub fn exit_status(report: &RunReport) -> i32 {
    match report.status {
        Status::Succeeded => 0,
        Status::Failed => report
            .exit_code
            .map(|c| if (0..=255).contains(&c) { c as i32 } else { 1 })
            .unwrap_or(1),
        Status::CompileError => 1,
        Status::TimedOut => 124,
        Status::OutOfMemory => 137,
        Status::Stopped => 130,
        Status::SandboxError | Status::Queued | Status::Running => 125,
    }
}

/// Write the returned files under `dir` (their path below `outputs/`); say on stderr which
/// were left out and why.
fn write_outputs(dir: &Path, report: &RunReport) -> anyhow::Result<()> {
    use base64::Engine as _;
    for f in &report.files {
        let rel = f.path.strip_prefix("outputs/").unwrap_or(&f.path);
        let safe = crate::contract::stays_inside(rel);
        let (Some(data), true) = (&f.content_base64, safe) else {
            eprintln!(
                "codebox: {} not written: {}",
                f.path,
                f.omitted_reason.as_deref().unwrap_or("not a safe path")
            );
            continue;
        };
        let bytes = base64::engine::general_purpose::STANDARD.decode(data)?;
        let target = dir.join(rel);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&target, bytes)
            .with_context(|| format!("cannot write {}", target.display()))?;
    }
    Ok(())
}

/// How often the wait for the end re-arms (the run manager's wait is bounded).
const WAIT_SLICE: Duration = Duration::from_secs(60);

/// The help of the limit flags, with the defaults and maximums of `config` (what
/// `codebox run --help` shows).
pub(super) fn limit_help(config: &crate::config::Config) -> [(&'static str, String); 3] {
    let (d, m) = (config.limits.defaults(), config.ceilings());
    [
        (
            "memory_mb",
            format!(
                "Memory limit in MB (default {}, max {})",
                d.memory_mb, m.memory_mb
            ),
        ),
        (
            "timeout_seconds",
            format!(
                "Wall-clock limit in seconds (default {}, max {})",
                d.timeout_seconds, m.timeout_seconds
            ),
        ),
        (
            "cpus",
            format!("CPU quota in cores (default {}, max {})", d.cpus, m.cpus),
        ),
    ]
}

/// Whether `--outputs DIR` can be written to: a folder, or nothing yet. Checked before the
/// run, so that a run is never made for output that could not be kept.
fn check_outputs_dir(dir: &Path) -> anyhow::Result<()> {
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => bail!(
            "--outputs {}: it exists and is not a folder; name a folder (it is created if missing)",
            dir.display()
        ),
        _ => Ok(()),
    }
}

pub async fn run_file(app: &App, args: RunArgs) -> anyhow::Result<i32> {
    let from_stdin = args.file.as_os_str() == "-";
    if from_stdin && args.language.is_none() {
        bail!("codebox run -: the program comes from standard input, so pass --language (see `codebox languages`)");
    }
    if let Some(dir) = &args.outputs {
        check_outputs_dir(dir)?;
    }
    let code = if from_stdin {
        std::io::read_to_string(std::io::stdin())
            .context("codebox run -: cannot read the program from standard input")?
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("cannot read the program {}", args.file.display()))?
    };
    let language = match &args.language {
        Some(l) => l.clone(),
        None => match app.registry.for_file(&args.file) {
            Some(l) => l.id.clone(),
            None => bail!(
                "cannot tell the language of {} from its extension; pass --language (`codebox languages` lists each language's extensions and aliases)",
                args.file.display()
            ),
        },
    };
    let stdin = match &args.stdin {
        Some(p) => Some(
            std::fs::read_to_string(p)
                .with_context(|| format!("--stdin {}: cannot read it", p.display()))?,
        ),
        None => None,
    };
    let req = RunRequest {
        language,
        code,
        stdin,
        args: Some(args.args.clone()),
        files: None,
        limits: Some(LimitsInput {
            memory_mb: args.memory_mb,
            timeout_seconds: args.timeout_seconds,
            cpus: args.cpus,
        }),
        ..Default::default()
    };
    // A reachable daemon first gets its leftovers swept and the image built if missing; an
    // unreachable one is reported by the run itself, as a sandbox_error that says where.
    if let Ok(info) = app.engine.ping().await {
        super::check_runtimes(app, &info)?;
        app.reap().await;
        if let Some(lang) = app.registry.resolve(&req.language) {
            super::images::ensure(app, lang).await?;
        }
    }
    // Watched before the run exists: a Ctrl-C or a SIGTERM stops it (its row then ends
    // `stopped`, its containers go), rather than killing the process with the run in flight.
    let interrupted = crate::transport::shutdown_signal();
    let accepted = app.runs.submit(req).map_err(|e| match e {
        SubmitError::Invalid(e) => anyhow::anyhow!("invalid argument {e}"),
        other => anyhow::anyhow!(other),
    })?;
    let run_id = accepted.run_id;
    let stopper = {
        let runs = app.runs.clone();
        let run_id = run_id.clone();
        tokio::spawn(async move {
            interrupted.await;
            let _ = runs.stop(&run_id).await;
        })
    };
    let report = loop {
        let r = app.runs.wait(&run_id, WAIT_SLICE).await?;
        if r.status.is_terminal() {
            break r;
        }
    };
    stopper.abort();
    // The run happened: its output is printed first, whatever happens to the files.
    print_report(app, &args, &report)?;
    if let Some(dir) = &args.outputs {
        if let Err(e) = write_outputs(dir, &report) {
            eprintln!(
                "codebox: the files under outputs/ were not all written to {}: {e:#}",
                dir.display()
            );
            return Ok(exit_status(&report).max(1));
        }
    } else if !report.files.is_empty() && !args.json {
        let n = report.files.len();
        eprintln!(
            "codebox: the program left {n} file{} under outputs/, not kept; pass --outputs DIR to write them there",
            if n == 1 { "" } else { "s" }
        );
    }
    Ok(exit_status(&report))
}

/// The program's output, then a summary line on stderr (or the report as JSON).
fn print_report(app: &App, args: &RunArgs, report: &RunReport) -> anyhow::Result<()> {
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        if let Some(c) = &report.compile {
            if report.status == Status::CompileError {
                eprint!("{}{}", c.stdout, c.stderr);
            }
        }
        print!("{}", report.stdout);
        std::io::stdout().flush()?;
        eprint!("{}", report.stderr);
        if report.stdout_truncated || report.stderr_truncated {
            eprintln!(
                "codebox: output was cut at {} bytes per stream ({} stdout bytes, {} stderr bytes in all)",
                app.config.sandbox.output_limit_bytes, report.stdout_bytes, report.stderr_bytes
            );
        }
        // The compiler's output was just printed: point there, not at a JSON field.
        let message = report.message.replace(
            "the compiler's output is in compile.stderr",
            "its output is above",
        );
        eprintln!(
            "codebox: {} ({message}) in {} ms",
            report.status, report.duration_ms
        );
    }
    Ok(())
}
