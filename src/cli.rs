//! The `codebox` commands. With `main.rs`, the only place that uses anyhow.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use clap::{Parser, Subcommand};
use tokio_util::sync::CancellationToken;

use crate::catalog;
use crate::config::Config;
use crate::engine::docker::DockerEngine;
use crate::engine::ContainerEngine;
use crate::executor::{new_run_id, Executor, LimitsInput, RunRequest, ValidRequest};
use crate::images;
use crate::instance::Instance;
use crate::reaper;
use crate::registry::{Language, Registry, DEFAULT_REGISTRY_FILE};
use crate::report::{RunReport, Status};

#[derive(Debug, Parser)]
#[command(
    name = "codebox",
    version,
    about = "Run untrusted code in locked-down Docker containers, for AI agents (MCP) and people."
)]
pub struct Cli {
    /// Operator config file (TOML).
    #[arg(long, global = true, env = "CODEBOX_CONFIG")]
    pub config: Option<PathBuf>,
    /// Language registry file.
    #[arg(long, global = true, env = "CODEBOX_LANGUAGES")]
    pub languages: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program file and print its output; the exit status mirrors the program's.
    Run(RunArgs),
    /// List the supported languages.
    Languages {
        /// Print the same object as the `list_supported_languages` tool.
        #[arg(long)]
        json: bool,
    },
    /// Build or list the language images.
    Images {
        #[command(subcommand)]
        action: ImagesAction,
    },
    /// Run every language's smoke samples; ends with `N passed, M failed`.
    Smoke {
        /// Languages to test (default: all).
        #[arg(value_name = "LANG")]
        only: Vec<String>,
        /// Build missing images first.
        #[arg(long)]
        build: bool,
    },
    /// Check Docker, the images and the sandbox posture from inside a container.
    Doctor,
    /// Serve the MCP tools over stdio (default) or Streamable HTTP.
    Serve(crate::transport::ServeArgs),
    /// Show the latest runs recorded by `codebox serve`.
    History(crate::history::command::HistoryArgs),
}

#[derive(Debug, Subcommand)]
pub enum ImagesAction {
    /// Build images (default: all) from their folders under `images/`.
    Build {
        names: Vec<String>,
        /// Rebuild every layer, e.g. to pick up Debian's security updates.
        #[arg(long)]
        no_cache: bool,
    },
    /// Show which images are present.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The program's source file.
    pub file: PathBuf,
    /// Language id or alias (default: guessed from the file's extension).
    #[arg(long, short)]
    pub language: Option<String>,
    /// File whose content is the program's standard input.
    #[arg(long)]
    pub stdin: Option<PathBuf>,
    #[arg(long)]
    pub memory_mb: Option<f64>,
    #[arg(long)]
    pub timeout_seconds: Option<f64>,
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Print the run report as JSON instead of the program's output.
    #[arg(long)]
    pub json: bool,
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

/// What every command needs: settings, languages, the engine.
pub struct Context {
    pub config: Arc<Config>,
    pub registry: Arc<Registry>,
    pub engine: Arc<DockerEngine>,
    pub instance: Instance,
    pub executor: Arc<Executor>,
}

/// `languages.toml`: the flag or env, else the config file's, else the current folder's,
/// else the one next to the sources this binary was built from.
fn registry_path(cli: &Cli, config: &Config) -> PathBuf {
    if let Some(p) = cli
        .languages
        .clone()
        .or_else(|| config.languages_path.clone())
    {
        return p;
    }
    let here = PathBuf::from(DEFAULT_REGISTRY_FILE);
    if here.exists() {
        return here;
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(DEFAULT_REGISTRY_FILE)
}

impl Context {
    pub fn load(cli: &Cli) -> anyhow::Result<Context> {
        let config = match &cli.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        let registry = Registry::load(&registry_path(cli, &config))?;
        let engine = Arc::new(DockerEngine::connect()?);
        let instance = Instance::register(&config.data_dir);
        let config = Arc::new(config);
        let executor = Arc::new(Executor::new(
            engine.clone(),
            config.clone(),
            instance.id.clone(),
        ));
        Ok(Context {
            config,
            registry: Arc::new(registry),
            engine,
            instance,
            executor,
        })
    }

    /// Remove what crashed instances left; a failure here is only logged.
    pub async fn reap(&self) {
        if let Err(e) = reaper::reap(
            self.engine.as_ref(),
            &self.instance.id,
            &self.config.data_dir,
        )
        .await
        {
            tracing::warn!(error = %e, "could not sweep containers left by earlier instances");
        }
    }

    /// Build the image of `lang` if it is missing, showing progress on stderr.
    pub async fn ensure_image(&self, lang: &Language) -> Result<(), anyhow::Error> {
        if self.engine.inspect_image(&lang.image.tag).await?.is_some() {
            return Ok(());
        }
        eprintln!(
            "codebox: image {} is missing; building it from {} (first use only)",
            lang.image.tag,
            lang.image.context.display()
        );
        self.build_image(&lang.image.name, false).await
    }

    async fn build_image(&self, name: &str, no_cache: bool) -> anyhow::Result<()> {
        let image = images::find(&self.registry, name)?;
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {prefix} [{elapsed}] {wide_msg}")
                .expect("static template"),
        );
        bar.set_prefix(image.tag.clone());
        bar.enable_steady_tick(Duration::from_millis(120));
        let started = Instant::now();
        let progress = {
            let bar = bar.clone();
            move |line: &str| {
                if line.starts_with("Step ") || !bar.is_hidden() {
                    bar.set_message(line.to_string());
                }
                if bar.is_hidden() && line.starts_with("Step ") {
                    eprintln!("  {line}");
                }
            }
        };
        let result =
            images::build(&self.executor, &self.registry, image, no_cache, &progress).await;
        bar.finish_and_clear();
        let id = result?;
        eprintln!(
            "built {} ({}) in {:.1} s",
            image.tag,
            &id.trim_start_matches("sha256:")[..12.min(id.len())],
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Run the CLI; returns the process exit status.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let ctx = Context::load(&cli)?;
    match cli.command {
        Command::Run(args) => run_file(&ctx, args).await,
        Command::Languages { json } => languages(&ctx, json).await,
        Command::Images { action } => images_cmd(&ctx, action).await,
        Command::Smoke { only, build } => smoke(&ctx, &only, build).await,
        Command::Doctor => doctor(&ctx).await,
        Command::Serve(args) => Ok(crate::transport::serve(&ctx, args).await?),
        Command::History(args) => {
            let mut config = (*ctx.config).clone();
            config.apply_env(|k| std::env::var(k).ok())?;
            Ok(
                crate::history::command::run(&config, &ctx.registry, &ctx.instance.id, args)
                    .await?,
            )
        }
    }
}

fn sandbox_error_report(req: &ValidRequest, message: String) -> RunReport {
    let mut r = Executor::blank_report(&new_run_id(), req);
    r.status = Status::SandboxError;
    r.message = message;
    r
}

async fn run_file(ctx: &Context, args: RunArgs) -> anyhow::Result<i32> {
    let code = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let language = match &args.language {
        Some(l) => l.clone(),
        None => match ctx.registry.for_file(&args.file) {
            Some(l) => l.id.clone(),
            None => bail!(
                "cannot tell the language of {} from its extension; pass --language (see `codebox languages`)",
                args.file.display()
            ),
        },
    };
    let stdin = match &args.stdin {
        Some(p) => Some(
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
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
    };
    let valid = ValidRequest::new(req, &ctx.registry, &ctx.config)?;

    let report = match ctx.engine.ping().await {
        Err(e) => sandbox_error_report(&valid, e.to_string()),
        Ok(_) => {
            ctx.reap().await;
            ctx.ensure_image(&valid.language).await?;
            let cancel = CancellationToken::new();
            let stop = cancel.clone();
            tokio::spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    stop.cancel();
                }
            });
            ctx.executor.execute(&new_run_id(), &valid, 0, cancel).await
        }
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        use std::io::Write;
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
                ctx.config.sandbox.output_limit_bytes, report.stdout_bytes, report.stderr_bytes
            );
        }
        eprintln!(
            "codebox: {} ({}) in {} ms",
            report.status, report.message, report.duration_ms
        );
    }
    Ok(exit_status(&report))
}

async fn languages(ctx: &Context, json: bool) -> anyhow::Result<i32> {
    let cat = catalog::catalog(ctx.engine.as_ref(), &ctx.registry, &ctx.config).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&cat)?);
        return Ok(0);
    }
    println!(
        "{:<12} {:<22} {:<24} {:<8} {:<9} VERSION",
        "LANGUAGE", "NAME", "IMAGE", "PRESENT", "COMPILED"
    );
    for l in &cat.languages {
        println!(
            "{:<12} {:<22} {:<24} {:<8} {:<9} {}",
            l.language,
            l.display_name,
            l.image,
            if l.image_present { "yes" } else { "no" },
            if l.compiled { "yes" } else { "no" },
            l.version.as_deref().unwrap_or("-")
        );
    }
    let (d, c) = (cat.limits.defaults, cat.limits.ceilings);
    println!(
        "\nlimits: memory {} MB (max {}), timeout {} s (max {}), cpus {} (max {})",
        d.memory_mb, c.memory_mb, d.timeout_seconds, c.timeout_seconds, d.cpus, c.cpus
    );
    Ok(0)
}

async fn images_cmd(ctx: &Context, action: ImagesAction) -> anyhow::Result<i32> {
    match action {
        ImagesAction::Build { names, no_cache } => {
            ctx.engine.ping().await?;
            let names: Vec<String> = if names.is_empty() {
                ctx.registry.images.keys().cloned().collect()
            } else {
                names
            };
            for name in &names {
                images::find(&ctx.registry, name)?;
            }
            for name in &names {
                ctx.build_image(name, no_cache).await?;
            }
            Ok(0)
        }
        ImagesAction::List { json } => {
            let list = images::status(ctx.engine.as_ref(), &ctx.registry).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(0);
            }
            println!(
                "{:<10} {:<24} {:<8} {:>9}  VERSIONS",
                "IMAGE", "TAG", "PRESENT", "SIZE"
            );
            for i in &list {
                let versions: Vec<String> = i
                    .versions
                    .iter()
                    .map(|(l, v)| format!("{l}: {v}"))
                    .collect();
                println!(
                    "{:<10} {:<24} {:<8} {:>9}  {}",
                    i.name,
                    i.tag,
                    if i.present { "yes" } else { "missing" },
                    i.size_bytes
                        .map(|s| format!("{} MB", s / 1_000_000))
                        .unwrap_or_else(|| "-".into()),
                    versions.join("; ")
                );
            }
            Ok(0)
        }
    }
}

/// Compare a report with a sample's expectation; `None` when it matches.
pub fn smoke_mismatch(report: &RunReport, expect: &crate::registry::Expect) -> Option<String> {
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

async fn smoke(ctx: &Context, only: &[String], build: bool) -> anyhow::Result<i32> {
    let langs: Vec<&Language> = if only.is_empty() {
        ctx.registry.languages.values().collect()
    } else {
        only.iter()
            .map(|l| {
                ctx.registry
                    .resolve(l)
                    .with_context(|| format!("unknown language `{l}`"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    ctx.engine.ping().await?;
    ctx.reap().await;
    let (mut passed, mut failed) = (0usize, 0usize);
    for lang in langs {
        if build {
            ctx.ensure_image(lang).await?;
        }
        for sample in &lang.tests {
            let req = RunRequest {
                language: lang.id.clone(),
                code: sample.code.clone(),
                stdin: sample.stdin.clone(),
                args: Some(sample.args.clone()),
                ..Default::default()
            };
            let valid = ValidRequest::new(req, &ctx.registry, &ctx.config)?;
            let report = ctx
                .executor
                .execute(&new_run_id(), &valid, 0, CancellationToken::new())
                .await;
            match smoke_mismatch(&report, &sample.expect) {
                None => {
                    passed += 1;
                    println!(
                        "ok   {}/{} ({} ms)",
                        lang.id, sample.name, report.duration_ms
                    );
                }
                Some(why) => {
                    failed += 1;
                    println!("FAIL {}/{}: {why}", lang.id, sample.name);
                }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { 0 } else { 1 })
}

/// The posture probe: printed facts, checked one by one.
const PROBE: &str = "echo uid=$(id -u); \
echo capeff=$(awk '/^CapEff/{print $2}' /proc/self/status); \
echo nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status); \
echo net=$(ls /sys/class/net | tr '\\n' ' '); \
if touch /codebox-probe 2>/dev/null; then echo rootfs=writable; else echo rootfs=readonly; fi";

async fn doctor(ctx: &Context) -> anyhow::Result<i32> {
    let (mut ok, mut bad) = (0, 0);
    let mut check = |pass: bool, what: String| {
        println!("  {} {what}", if pass { "ok  " } else { "FAIL" });
        if pass {
            ok += 1
        } else {
            bad += 1
        }
    };
    println!("Docker:");
    let info = match ctx.engine.ping().await {
        Ok(info) => info,
        Err(e) => {
            check(false, e.to_string());
            println!("{ok} passed, {bad} failed");
            return Ok(1);
        }
    };
    check(
        true,
        format!(
            "reachable at {} (Docker {}, API {})",
            info.address, info.version, info.api_version
        ),
    );
    println!("Images:");
    let list = images::status(ctx.engine.as_ref(), &ctx.registry).await?;
    for i in &list {
        if i.present {
            let v: Vec<&str> = i.versions.values().map(String::as_str).collect();
            check(true, format!("{} present ({})", i.tag, v.join("; ")));
        } else {
            check(
                false,
                format!("{} missing: run `codebox images build {}`", i.tag, i.name),
            );
        }
    }
    let Some(probe_image) = list.iter().find(|i| i.present) else {
        println!("Posture probe: skipped, no image is present");
        println!("{ok} passed, {} failed", bad + 1);
        return Ok(1);
    };
    println!(
        "Posture probe (a locked-down container from {}):",
        probe_image.tag
    );
    match ctx
        .executor
        .probe(
            &probe_image.tag,
            vec!["sh".into(), "-c".into(), PROBE.into()],
            Duration::from_secs(30),
        )
        .await
    {
        Err(e) => check(false, format!("the probe container failed: {e}")),
        Ok(exec) => {
            let out = exec.stdout.text();
            let get = |key: &str| {
                out.lines()
                    .find_map(|l| l.strip_prefix(&format!("{key}=")))
                    .unwrap_or("?")
                    .trim()
                    .to_string()
            };
            let uid = get("uid");
            check(
                uid != "0" && uid != "?",
                format!("runs as uid {uid}, not root"),
            );
            let cap = get("capeff");
            check(
                cap.chars().all(|c| c == '0') && !cap.is_empty() && cap != "?",
                format!("no capabilities (CapEff {cap})"),
            );
            let nnp = get("nnp");
            check(nnp == "1", format!("no new privileges (NoNewPrivs {nnp})"));
            let net = get("net");
            check(
                net == "lo",
                format!("network interfaces: {net} (only lo allowed)"),
            );
            let rootfs = get("rootfs");
            check(rootfs == "readonly", format!("root filesystem is {rootfs}"));
        }
    }
    println!("{ok} passed, {bad} failed");
    Ok(if bad == 0 { 0 } else { 1 })
}
