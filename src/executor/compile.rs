//! The compile stage and its cache, and the syntax check that some interpreted languages run
//! in the run container first: how either ends a run (`compile_error`, or a timeout, an
//! out-of-memory kill, a stop or a sandbox error during it).

use std::time::Duration;

use bytes::Bytes;

use super::cache::{self, CompileCache, Verdict};
use super::containers::{Containers, Want};
use super::ends::{budget, mb, ms, sources, CompileEnd, Halt, Known, SandboxFailure};
use super::outcome::Streams;
use super::outcome::{classify, Outcome};
use super::stage::{Answer, Bound};
use crate::contract::{stays_inside, ValidRequest};
use crate::engine::posture::Limits;
use crate::engine::protocol::{self, Collect, End, Entry, EntryKind, Files, Payload, PhaseName};
use crate::registry::Language;
use crate::report::{fmt_num, CompileReport, Stage, Status, Usage};

/// What compiling gave: the run stage's files, or how the run ends here.
pub(super) type Compiled = Result<Files, CompileEnd>;

/// The exit code a report shows for how a phase ended: the code, or `128 + n` for a death
/// by signal `n` (a number from the container: out of range is no code at all).
pub(super) fn reported_exit_code(end: &End) -> Option<i64> {
    match end {
        End::Exited(c) => Some(*c),
        End::Signaled(n) => (1..=64).contains(n).then(|| 128 + n),
        _ => None,
    }
}

pub(super) fn compile_report(
    status: Status,
    phase: &protocol::Phase,
    result: &Answer,
    usage: Usage,
) -> CompileReport {
    let st = Streams::of(Some(phase));
    CompileReport {
        status,
        exit_code: phase.end.as_ref().and_then(|e| reported_exit_code(&e.end)),
        stdout: st.stdout,
        stderr: st.stderr,
        duration_ms: phase
            .end
            .as_ref()
            .map_or_else(|| ms(result.duration), |e| e.wall_ms),
        usage,
        cached: false,
    }
}

/// The compile stage of every run that compiles, and the cache of its verdicts.
pub(super) struct Compiler {
    cache: CompileCache,
}

impl Compiler {
    pub(super) fn new(cache_mb: u64) -> Compiler {
        Compiler {
            cache: CompileCache::new(cache_mb),
        }
    }

    /// The compile cache's hits and misses: (hits, misses).
    pub(super) fn counts(&self) -> (u64, u64) {
        self.cache.counts()
    }

    /// The compile stage, or its verdict from the compile cache when the same inputs were
    /// compiled before.
    pub(super) async fn compile_cached(
        &self,
        containers: &Containers,
        run_id: &str,
        req: &ValidRequest,
        known: &mut Known,
        bound: Bound<'_>,
    ) -> Result<Compiled, Halt> {
        let lang = &req.language;
        let image_id = containers
            .image(&lang.image.tag, &lang.image.name, bound)
            .await?
            .id;
        known.image_id = Some(image_id.clone());
        let key = cache::key(&image_id, lang, &req.code, &req.files);
        let from_cache = |c: &CompileReport| CompileReport {
            cached: true,
            duration_ms: 0,
            usage: Usage::default(),
            ..c.clone()
        };
        match self.cache.get(&key) {
            Some(Verdict::Compiled { report, artifacts }) => {
                known.compile = Some(from_cache(&report));
                return Ok(Ok(artifacts));
            }
            Some(Verdict::Refused { report }) => {
                known.stage = Some(Stage::Compile);
                known.compile = Some(from_cache(&report));
                return Ok(Err(CompileEnd {
                    status: Status::CompileError,
                    exit_code: report.exit_code,
                    signal: None,
                    message: format!(
                        "compilation failed with exit code {} (the same code and files failed before); the compiler's output is in compile.stderr",
                        report.exit_code.unwrap_or(-1)
                    ),
                }));
            }
            None => {}
        }
        let compiled = compile(containers, run_id, req, known, bound).await?;
        if let Some(c) = &known.compile {
            match &compiled {
                Ok(files) => self.cache.put(
                    key,
                    Verdict::Compiled {
                        report: c.clone(),
                        artifacts: files.clone(),
                    },
                ),
                Err(end) if end.status == Status::CompileError => {
                    self.cache.put(key, Verdict::Refused { report: c.clone() })
                }
                Err(_) => {}
            }
        }
        Ok(compiled)
    }
}

/// The compile stage: the source and files in, the whole working directory back.
async fn compile(
    containers: &Containers,
    run_id: &str,
    req: &ValidRequest,
    known: &mut Known,
    bound: Bound<'_>,
) -> Result<Compiled, Halt> {
    let lang = &req.language;
    let limits = lang.compile_limits;
    let timeout = Duration::from_secs_f64(limits.timeout_seconds);
    let want = Want {
        name: format!("codebox-{run_id}-compile"),
        image_tag: lang.image.tag.clone(),
        image_name: lang.image.name.clone(),
        limits: Limits {
            memory_mb: limits.memory_mb,
            cpus: limits.cpus,
        },
        workspace_mb: limits.workspace_mb,
        labels: containers.run_labels(run_id, budget(req)),
        prefix: None,
    };
    let container = containers.acquire(&want, bound).await?;
    let payload = Payload {
        env: lang.env.clone(),
        run: lang.compile.clone(),
        timeout,
        output_limit: containers.config.sandbox.output_limit_bytes,
        collect: Some(Collect::WorkspaceOnSuccess {
            max_bytes: mb(limits.workspace_mb),
        }),
        files: Files::new(&sources(req)),
        ..Default::default()
    };
    known.stage = Some(Stage::Compile);
    let result = containers
        .run_in(
            &want,
            container,
            payload,
            timeout,
            mb(limits.workspace_mb),
            bound,
        )
        .await?;
    known.image_id = result.image_id.clone();
    let Some(phase) = result.decoded.phase(PhaseName::Run) else {
        let o = classify(None, &result);
        return Err(match o.problem {
            Some(problem) => SandboxFailure::Unexplained(problem),
            None => SandboxFailure::CompileNotStarted,
        }
        .into());
    };
    let o = classify(Some(phase), &result);
    if o.status != Status::Succeeded {
        return Ok(Err(compile_failed(known, o, phase, &result, lang, None)));
    }
    known.compile = Some(compile_report(Status::Succeeded, phase, &result, o.usage));
    if let Some(fatal) = &result.decoded.fatal {
        return Err(SandboxFailure::InitFatal(fatal.clone()).into());
    }
    let mut artifacts = Vec::with_capacity(result.decoded.files.len());
    for f in result.decoded.files {
        if !stays_inside(&f.path) {
            return Err(SandboxFailure::ArtifactPath { path: f.path }.into());
        }
        artifacts.push(Entry {
            kind: f.kind,
            path: f.path,
            mode: f.mode & 0o777,
            content: if f.kind == EntryKind::File {
                Bytes::from(f.content)
            } else {
                Bytes::new()
            },
            target: f.target,
        });
    }
    Ok(Ok(Files::new(&artifacts)))
}

/// How a failed syntax check in the run container ends the run, if it failed; a check
/// that passed goes into the report's `compile`.
pub(super) fn check_failed(
    result: &Answer,
    lang: &Language,
    known: &mut Known,
    run_memory_mb: u64,
) -> Option<CompileEnd> {
    let check = result.decoded.phase(PhaseName::Check)?;
    let o = classify(Some(check), result);
    if o.status != Status::Succeeded {
        return Some(compile_failed(
            known,
            o,
            check,
            result,
            lang,
            Some(run_memory_mb),
        ));
    }
    known.compile = Some(compile_report(Status::Succeeded, check, result, o.usage));
    None
}

/// A compile stage (or, with `check_memory_mb`, a syntax check in a run container of that
/// memory) that did not succeed: the run ends here.
fn compile_failed(
    known: &mut Known,
    o: Outcome,
    phase: &protocol::Phase,
    result: &Answer,
    lang: &Language,
    check_memory_mb: Option<u64>,
) -> CompileEnd {
    let limits = lang.compile_limits;
    let what = if check_memory_mb.is_some() {
        "the syntax check"
    } else {
        "compilation"
    };
    let (status, message) = match o.status {
        Status::Stopped => (Status::Stopped, format!("stopped during {what}")),
        Status::TimedOut => (
            Status::TimedOut,
            format!(
                "{what} was killed at its {} s wall-clock limit",
                fmt_num(limits.timeout_seconds)
            ),
        ),
        Status::OutOfMemory => (
            Status::OutOfMemory,
            format!(
                "{what} was killed by the out-of-memory killer at its {} MB limit",
                check_memory_mb.unwrap_or(limits.memory_mb)
            ),
        ),
        Status::SandboxError => (Status::SandboxError, o.problem.clone().unwrap_or_default()),
        _ => (
            Status::CompileError,
            format!(
                "{what} failed with exit code {}; the compiler's output is in compile.stderr",
                o.exit_code.unwrap_or(-1)
            ),
        ),
    };
    known.compile = Some(compile_report(status, phase, result, o.usage.clone()));
    let compile_error = status == Status::CompileError;
    CompileEnd {
        status,
        exit_code: o.exit_code.filter(|_| compile_error),
        signal: o.signal.filter(|_| compile_error),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_number_from_the_container_never_overflows_the_exit_code() {
        assert_eq!(reported_exit_code(&End::Signaled(9)), Some(137));
        assert_eq!(reported_exit_code(&End::Signaled(i64::MAX)), None);
        assert_eq!(reported_exit_code(&End::Signaled(-3)), None);
        assert_eq!(reported_exit_code(&End::Exited(3)), Some(3));
    }
}
