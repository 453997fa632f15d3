//! A run with `tests`: the program is compiled once, the first case runs the syntax check
//! (if the language has one) alone, then every other case runs in a fresh container of its
//! own, several at once. A stop ends the cases under way and starts no more.

use futures_util::StreamExt;

use super::compile::check_failed;
use super::containers::{Acquired, Containers};
use super::ends::{ms, Ended, Halt, Known};
use super::outcome::classify;
use super::outcome::Streams;
use super::program::Program;
use super::stage::{Answer, Bound};
use crate::config::Config;
use crate::contract::{ValidRequest, ValidTest};
use crate::engine::protocol::{Collect, PhaseName};
use crate::report::{RunReport, Status, TestReport, TestsSummary, Usage};

/// Case statuses from the most severe: the run's status is the first any case has.
const SEVERITY: [Status; 5] = [
    Status::SandboxError,
    Status::Stopped,
    Status::TimedOut,
    Status::OutOfMemory,
    Status::Failed,
];

/// How many containers of a run execute at once: one, or for test cases as many as the
/// concurrency cap and the memory budget allow (the run manager admits the run for that many).
pub(crate) fn parallelism(req: &ValidRequest, config: &Config) -> usize {
    if req.tests.len() <= 1 {
        return 1;
    }
    let by_memory = (config.runs.memory_budget_mb / req.limits.memory_mb.max(1)).max(1) as usize;
    req.tests
        .len()
        .min(config.runs.max_concurrent_runs)
        .min(by_memory)
        .max(1)
}

/// A case that never ran because the run was stopped first.
fn not_started(t: &ValidTest) -> TestReport {
    TestReport {
        name: t.name.clone(),
        status: Status::Stopped,
        passed: t.expected_stdout.as_ref().map(|_| false),
        exit_code: None,
        signal: None,
        stdout: String::new(),
        stderr: "stopped before this case started".into(),
        stdout_truncated: false,
        stderr_truncated: false,
        duration_ms: 0,
        usage: Usage::default(),
    }
}

fn case_report(t: &ValidTest, req: &ValidRequest, result: Result<Answer, Halt>) -> TestReport {
    let result = match result {
        Ok(result) => result,
        Err(Halt::Stopped) => return not_started(t),
        Err(Halt::Failed(e)) => {
            return TestReport {
                status: Status::SandboxError,
                stderr: e.to_string(),
                ..not_started(t)
            }
        }
    };
    let phase = result.decoded.phase(PhaseName::Run);
    let o = classify(phase, &result);
    let st = Streams::of(phase);
    TestReport {
        name: t.name.clone(),
        passed: t
            .expected_stdout
            .as_deref()
            .map(|e| o.status == Status::Succeeded && req.compare.matches(e, &st.stdout)),
        status: o.status,
        exit_code: o.exit_code,
        signal: o.signal,
        stdout_truncated: st.stdout_truncated(),
        stderr_truncated: st.stderr_truncated(),
        stdout: st.stdout,
        stderr: match o.problem {
            Some(problem) => problem,
            None => st.stderr,
        },
        duration_ms: phase
            .and_then(|p| p.end.as_ref())
            .map_or_else(|| ms(result.duration), |e| e.wall_ms),
        usage: o.usage,
    }
}

/// Fill a report from its test cases.
pub(super) fn summarise(report: &mut RunReport, cases: Vec<TestReport>) {
    let passed = cases
        .iter()
        .filter(|c| c.passed.unwrap_or(c.status == Status::Succeeded))
        .count() as u64;
    let total = cases.len() as u64;
    report.status = SEVERITY
        .into_iter()
        .find(|s| cases.iter().any(|c| c.status == *s))
        .unwrap_or(Status::Succeeded);
    report.usage = Usage {
        cpu_time_ms: cases.iter().map(|c| c.usage.cpu_time_ms).sum(),
        peak_memory_kb: cases.iter().filter_map(|c| c.usage.peak_memory_kb).max(),
    };
    report.message = format!("{passed} of {total} tests passed");
    report.tests_summary = Some(TestsSummary {
        passed,
        failed: total - passed,
        total,
    });
    report.tests = cases;
}

/// Run every test case; `first` is the first case's container, prepared already.
pub(super) async fn run(
    containers: &Containers,
    run_id: &str,
    req: &ValidRequest,
    program: &Program,
    first: Acquired,
    known: &mut Known,
    bound: Bound<'_>,
) -> Result<Ended, Halt> {
    let lang = &req.language;
    let limit = program.limit();
    let prefix = known.prefix.clone();
    let case = |i: usize, container: Option<Acquired>, check: bool| {
        let t = &req.tests[i];
        // Cases may run at once: each writes the live feed with its own pen, tagged.
        let bound = Bound {
            case: u32::try_from(i + 1).ok().filter(|_| req.tests.len() > 1),
            ..bound
        };
        let want = containers.run_want(run_id, req, &format!("t{}", i + 1), prefix.as_ref());
        let p = program.payload(
            req,
            &containers.config,
            &t.args,
            t.stdin.clone(),
            check,
            Collect::None,
        );
        async move {
            let container = match container {
                Some(c) => c,
                // A stopped run starts no more cases: no container is made for them.
                None if bound.cancel.is_cancelled() => return Err(Halt::Stopped),
                None => containers.acquire(&want, bound).await?,
            };
            containers
                .run_in(&want, container, p, limit, 0, bound)
                .await
        }
    };
    let first_result = case(0, Some(first), true).await?;
    known.image_id = known.image_id.take().or(first_result.image_id.clone());
    if let Some(end) = check_failed(&first_result, lang, known, req.limits.memory_mb) {
        return Ok(Ended::AtCompile(end));
    }
    let parallel = parallelism(req, &containers.config);
    let rest: Vec<Result<Answer, Halt>> = futures_util::stream::iter(1..req.tests.len())
        .map(|i| case(i, None, false))
        .buffered(parallel)
        .collect()
        .await;
    let cases = std::iter::once(Ok(first_result))
        .chain(rest)
        .zip(&req.tests)
        .map(|(result, t)| case_report(t, req, result))
        .collect();
    Ok(Ended::Cases(cases))
}
