//! The `codebox` commands: parse the command line, resolve the configuration once, build the
//! application once, and hand it to one function per command. With `main.rs`, the only place
//! that uses anyhow, and the only place that picks a concrete container engine (Docker).

mod bench;
mod config;
mod doctor;
mod history;
mod images;
mod languages;
mod repl;
mod run;
mod serve;
mod smoke;

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::app::{App, SHUTDOWN_GRACE};
use crate::config::Config;
use crate::engine::docker::DockerEngine;
use crate::engine::ContainerEngine;
use crate::registry::{locate, Located, Registry};

pub use doctor::doctor;
pub use history::history;
pub use images::images;
pub use languages::languages;
pub use run::{exit_status, run_file};
pub use smoke::{smoke, smoke_mismatch};

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
    /// Language registry file (the `languages` setting).
    #[arg(long, global = true)]
    pub languages: Option<PathBuf>,
    /// Set any setting, e.g. `--set runs.max_concurrent_runs=2` (repeatable; `codebox config
    /// --list` lists them). Flags beat `CODEBOX_*` variables, which beat the config file.
    #[arg(long = "set", global = true, value_name = "SETTING=VALUE")]
    pub set: Vec<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a program file and print its output; the exit status mirrors the program's.
    Run(run::RunArgs),
    /// An interactive session: cells run in one container that keeps files and (for stateful
    /// languages) variables. Prints the session's id first; a cell's stdin is empty (`input()`
    /// gets end of file). Ctrl-C interrupts a cell, Ctrl-D ends the session.
    Repl(repl::ReplArgs),
    /// List the supported languages.
    Languages {
        /// Print the same object as the `list_supported_languages` tool.
        #[arg(long)]
        json: bool,
    },
    /// Build or list the language images.
    Images {
        #[command(subcommand)]
        action: images::ImagesAction,
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
    Serve(serve::ServeArgs),
    /// Show the latest runs (of `codebox run` and of the server).
    History(history::HistoryArgs),
    /// Measure codebox next to `docker run --rm` (same image, equivalent flags), as ratios.
    Bench(bench::BenchArgs),
    /// Print the effective configuration as a config file, or list every setting.
    Config(config::ConfigArgs),
}

/// The command line, with the run limits' help showing this configuration's defaults and
/// maximums (as the environment and `CODEBOX_CONFIG` give it; the shipped defaults when that
/// cannot be read: the real error comes when the command runs).
pub fn command() -> clap::Command {
    use clap::CommandFactory;
    let file = std::env::var_os("CODEBOX_CONFIG").map(PathBuf::from);
    let config =
        crate::config::resolve(file.as_deref(), |k| std::env::var(k).ok(), &[]).unwrap_or_default();
    let help = run::limit_help(&config);
    Cli::command().mut_subcommand("run", |c| {
        help.into_iter()
            .fold(c, |c, (id, text)| c.mut_arg(id, |a| a.help(text)))
    })
}

/// The language registry of this process and why that one: the `languages` setting, else
/// `languages.toml` in the current folder, else the executable's own (see [`locate`]).
pub(crate) fn registry_file(config: &Config) -> anyhow::Result<Located> {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let exe = std::env::current_exe().ok();
    Ok(locate(config.languages.as_deref(), &cwd, exe.as_deref())?)
}

/// The configuration of this process: the file, then the environment, then the flags (the
/// shortcut flags `--languages` and `serve --listen` are `--set`s).
fn resolve_config(cli: &Cli) -> anyhow::Result<Config> {
    let mut sets = Vec::new();
    if let Some(l) = &cli.languages {
        sets.push(format!("languages={}", l.display()));
    }
    if let Command::Serve(args) = &cli.command {
        if let Some(listen) = &args.listen {
            sets.push(format!("http.listen={listen}"));
        }
    }
    // A bench keeps ready containers for what it measures, as `codebox serve` would (at least
    // one, and as many as `--concurrency` runs at once), or none.
    if let Command::Bench(args) = &cli.command {
        let defaults = crate::config::PoolSettings::default().sizes;
        let sizes: Vec<String> = if args.no_pool {
            Vec::new()
        } else {
            bench::languages(args)
                .iter()
                .map(|l| {
                    let n = defaults.get(l).copied().unwrap_or(1);
                    format!("\"{l}\" = {}", n.max(args.concurrency.clamp(1, 8)))
                })
                .collect()
        };
        sets.push(format!("pool.sizes={{ {} }}", sizes.join(", ")));
    }
    sets.extend(cli.set.iter().cloned());
    // A typo in a variable's name would otherwise be ignored without a word
    // (`CODEBOX_TEST_*` belong to the test suite).
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    for (var, near) in crate::config::unknown_env(names.filter(|n| !n.starts_with("CODEBOX_TEST_")))
    {
        match near {
            Some(near) => tracing::warn!("{var} is not a codebox setting and is ignored; did you mean {near}? (`codebox config --list` lists them)"),
            None => tracing::warn!("{var} is not a codebox setting and is ignored (`codebox config --list` lists them)"),
        }
    }
    if let Some(path) = cli.config.as_deref().filter(|p| !p.exists()) {
        let flag = std::env::args_os()
            .any(|a| a == "--config" || a.to_string_lossy().starts_with("--config="));
        anyhow::bail!(
            "{}: the config file {} does not exist",
            if flag { "--config" } else { "CODEBOX_CONFIG" },
            path.display()
        );
    }
    Ok(crate::config::resolve(
        cli.config.as_deref(),
        |k| std::env::var(k).ok(),
        &sets,
    )?)
}

/// Build the application on Docker: the one place a concrete engine is chosen.
fn docker_app(config: Config) -> anyhow::Result<App> {
    let registry = Registry::load(&registry_file(&config)?.path)?;
    let engine = DockerEngine::connect(&config.docker)?.with_data_dir(&config.data_dir);
    let engine: Arc<dyn ContainerEngine> = Arc::new(engine);
    Ok(App::build(config, registry, engine)?)
}

/// Run the CLI; returns the process exit status.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let config = resolve_config(&cli)?;
    if let Command::Config(args) = &cli.command {
        return config::print(&config, args, &mut std::io::stdout());
    }
    let app = docker_app(config)?;
    let code = dispatch(&app, cli.command).await;
    app.shutdown(SHUTDOWN_GRACE).await;
    code
}

/// Carry out one command on an assembled application.
pub async fn dispatch(app: &App, command: Command) -> anyhow::Result<i32> {
    let mut out = std::io::stdout();
    match command {
        Command::Run(args) => run_file(app, args).await,
        Command::Repl(args) => repl::repl(app, args).await,
        Command::Languages { json } => languages(app, json, &mut out).await,
        Command::Images { action } => images(app, action, &mut out).await,
        Command::Smoke { only, build } => smoke(app, &only, build, &mut out).await,
        Command::Doctor => doctor(app, &mut out).await,
        Command::Serve(args) => serve::serve(app, args).await,
        Command::History(args) => history(app, args, &mut out).await,
        Command::Bench(args) => bench::bench(app, args, &mut out).await,
        Command::Config(args) => config::print(&app.config, &args, &mut out),
    }
}

/// Refuse to go on when [`App::runtime_problems`] finds any: containers would run without
/// the runtime or the limits the settings ask for.
fn check_runtimes(app: &App, info: &crate::engine::EngineInfo) -> anyhow::Result<()> {
    match app.runtime_problems(info).as_slice() {
        [] => Ok(()),
        problems => anyhow::bail!("{}", problems.join("; ")),
    }
}

/// Flush what a command printed; a closed stdout (`codebox languages | head`) is not an error.
fn flush(out: &mut (dyn Write + Send)) -> anyhow::Result<()> {
    match out.flush() {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
