//! `codebox smoke [LANG...]`: every language's smoke samples through the run manager (several
//! at once, within its admission limits), printed in order; ends with `N passed, M failed`.

use std::io::Write;

use anyhow::Context as _;
use futures_util::StreamExt;

use crate::app::App;
use crate::contract::RunRequest;
use crate::registry::{Expect, Language, Sample};
use crate::report::{RunReport, Status};

/// Compare a report with a sample's expectation; `None` when it matches.
pub fn smoke_mismatch(report: &RunReport, expect: &Expect) -> Option<String> {
    if report.status != expect.status {
        let detail = match &report.compile {
            Some(c) if report.status == Status::CompileError => c.stderr.clone(),
            _ => format!("{}{}", report.stderr, report.message),
        };
        return Some(format!(
            "expected status {}, got {} ({})",
            expect.status,
            report.status,
            detail.trim()
        ));
    }
    if let Some(out) = &expect.stdout {
        if report.stdout != *out {
            return Some(format!("expected stdout {out:?}, got {:?}", report.stdout));
        }
    }
    if let Some(code) = expect.exit_code {
        if report.exit_code != Some(code) {
            return Some(format!(
                "expected exit code {code}, got {:?}",
                report.exit_code
            ));
        }
    }
    if let Some(needle) = &expect.stderr_contains {
        let stderr = match &report.compile {
            Some(c) if report.status == Status::CompileError => format!("{}{}", c.stdout, c.stderr),
            _ => report.stderr.clone(),
        };
        if !stderr.contains(needle.as_str()) {
            return Some(format!(
                "expected stderr to contain {needle:?}, got {stderr:?}"
            ));
        }
    }
    None
}

/// Run one sample to its end.
async fn run_sample(app: &App, lang: &Language, sample: &Sample) -> anyhow::Result<RunReport> {
    let req = RunRequest {
        language: lang.id.clone(),
        code: sample.code.clone(),
        stdin: sample.stdin.clone(),
        args: Some(sample.args.clone()),
        ..Default::default()
    };
    let accepted = app
        .runs
        .submit(req)
        .with_context(|| format!("{}/{}", lang.id, sample.name))?;
    Ok(app.runs.wait_end(&accepted.run_id).await?)
}

pub async fn smoke(
    app: &App,
    only: &[String],
    build: bool,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let langs: Vec<&Language> = if only.is_empty() {
        app.registry.languages.values().collect()
    } else {
        only.iter()
            .map(|l| {
                app.registry
                    .resolve(l)
                    .with_context(|| format!("unknown language `{l}`"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let info = app.engine.ping().await?;
    super::check_runtimes(app, &info)?;
    app.reap().await;
    if build {
        for lang in &langs {
            super::images::ensure(app, lang).await?;
        }
    }
    let samples: Vec<(&Language, &Sample)> = langs
        .iter()
        .flat_map(|l| l.tests.iter().map(move |s| (*l, s)))
        .collect();
    let mut reports = futures_util::stream::iter(samples.iter())
        .map(|(lang, sample)| async move { (*lang, *sample, run_sample(app, lang, sample).await) })
        .buffered(app.config.runs.max_concurrent_runs);
    let (mut passed, mut failed) = (0usize, 0usize);
    while let Some((lang, sample, report)) = reports.next().await {
        let report = report?;
        match smoke_mismatch(&report, &sample.expect) {
            None => {
                passed += 1;
                writeln!(
                    out,
                    "ok   {}/{} ({} ms)",
                    lang.id, sample.name, report.duration_ms
                )?;
            }
            Some(why) => {
                failed += 1;
                writeln!(out, "FAIL {}/{}: {why}", lang.id, sample.name)?;
            }
        }
        super::flush(out)?;
    }
    writeln!(out, "{passed} passed, {failed} failed")?;
    super::flush(out)?;
    Ok(if failed == 0 { 0 } else { 1 })
}
