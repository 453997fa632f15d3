//! `codebox serve`: the effective configuration (file, then `CODEBOX_*` environment, then
//! flags), the run manager and history, and one of the two transports: stdio (the default;
//! stdout carries only the protocol, logs go to stderr) or Streamable HTTP at `/mcp`.

pub mod http;
pub mod stdio;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::cli::Context;
use crate::config::{Config, ConfigError};
use crate::executor::Executor;
use crate::history::{History, Owner};
use crate::instance::Instance;
use crate::mcp::CodeboxServer;
use crate::reaper;
use crate::runs::{self, RunManager};

/// How long shutdown waits for stopped runs to remove their containers.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The two MCP transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    Stdio,
    Http,
}

/// `codebox serve` flags. Flags override the environment, which overrides the config file.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// `stdio` (for a client that starts codebox itself) or `http` (Streamable HTTP at /mcp).
    #[arg(long, value_enum, default_value = "stdio")]
    pub transport: TransportKind,
    /// Address to listen on with `--transport http` (default 127.0.0.1:8765; port 0 picks one).
    #[arg(long)]
    pub listen: Option<String>,
    /// File holding the HTTP bearer token (else the CODEBOX_TOKEN variable).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve HTTP without a token. Refused unless the listen address is loopback.
    #[arg(long)]
    pub no_auth: bool,
    /// Set any config setting, e.g. `--set runs.max_concurrent_runs=2` (repeatable).
    #[arg(long = "set", value_name = "SETTING=VALUE")]
    pub set: Vec<String>,
    /// Print the effective configuration (as a config file; never the token) and exit.
    #[arg(long)]
    pub print_config: bool,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Invalid(String),
    #[error("the HTTP transport needs a bearer token: set CODEBOX_TOKEN or pass --token-file FILE (on a loopback address, --no-auth serves without one)")]
    NoToken,
    #[error(
        "--no-auth is only allowed on a loopback address; {0} is not one. Set a token instead"
    )]
    NoAuthOnPublicAddress(String),
    #[error("cannot read the token file {path}: {source}")]
    TokenFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// The effective configuration of `serve`: the loaded file's settings, then the environment
/// (read through `env`), then the flags.
pub fn effective_config(
    file: &Config,
    args: &ServeArgs,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Config, ServeError> {
    let mut config = file.clone();
    config.apply_env(&env)?;
    let mut sets: Vec<(String, String)> = Vec::new();
    for item in &args.set {
        let Some((k, v)) = item.split_once('=') else {
            return Err(ServeError::Invalid(format!(
                "--set {item}: expected SETTING=VALUE"
            )));
        };
        sets.push((k.trim().to_string(), v.to_string()));
    }
    if let Some(l) = &args.listen {
        sets.push(("http.listen".into(), l.clone()));
    }
    if let Some(f) = &args.token_file {
        sets.push(("http.token_file".into(), f.display().to_string()));
    }
    for (setting, value) in sets {
        config.set(&setting, &value).map_err(|reason| {
            ServeError::Invalid(format!(
                "setting `{setting}` = {value:?} is invalid: {reason}"
            ))
        })?;
    }
    config.validate()?;
    Ok(config)
}

/// Everything a transport serves: the manager and a tool server factory.
pub struct Service {
    pub manager: RunManager,
    pub server: CodeboxServer,
    /// Held while serving: this process's instance lock, if it differs from the context's.
    _instance: Option<Instance>,
}

impl Service {
    /// Open the history, sweep what crashed instances left, and make the run manager.
    pub async fn start(ctx: &Context, config: Config) -> Result<Service, ServeError> {
        runs::check_budget(&ctx.registry, &config).map_err(ServeError::Invalid)?;
        // The instance lock must live in the effective data directory, where other instances
        // (and the next start after a crash) look for it.
        let own =
            (config.data_dir != ctx.config.data_dir).then(|| Instance::register(&config.data_dir));
        let instance_id = own
            .as_ref()
            .map_or_else(|| ctx.instance.id.clone(), |i| i.id.clone());
        let config = Arc::new(config);
        let executor = Arc::new(Executor::new(
            ctx.engine.clone(),
            config.clone(),
            instance_id.clone(),
        ));
        // Sweep first, then open the history: both judge whether earlier instances are dead,
        // and that judgement removes a dead instance's lock file, so they must not race.
        let reaped = match reaper::reap(ctx.engine.as_ref(), &instance_id, &config.data_dir).await {
            Ok(r) => r.containers,
            Err(e) => {
                tracing::warn!(error = %e, "could not sweep containers left by earlier instances");
                0
            }
        };
        let history = History::open(
            &config.history_path(),
            Owner {
                instance: instance_id.clone(),
                data_dir: config.data_dir.clone(),
            },
        );
        let manager = RunManager::new(
            executor,
            ctx.registry.clone(),
            config.clone(),
            Some(history),
        );
        manager.metrics().add_reaped(reaped);
        let server = CodeboxServer::new(manager.clone());
        Ok(Service {
            manager,
            server,
            _instance: own,
        })
    }
}

/// `codebox serve`: returns the exit status.
pub async fn serve(ctx: &Context, args: ServeArgs) -> Result<i32, ServeError> {
    let config = effective_config(&ctx.config, &args, |k| std::env::var(k).ok())?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(0);
    }
    let token = match args.transport {
        TransportKind::Http => {
            // Precedence: --token-file, then CODEBOX_TOKEN, then the config file's token_file.
            let env_token = std::env::var("CODEBOX_TOKEN")
                .ok()
                .filter(|t| !t.trim().is_empty());
            let mut auth_config = config.clone();
            if args.token_file.is_none() && env_token.is_some() {
                auth_config.http.token_file = None;
            }
            http::resolve_auth(&auth_config, args.no_auth, env_token)?
        }
        TransportKind::Stdio => None,
    };
    let service = Service::start(ctx, config.clone()).await?;
    let manager = service.manager.clone();
    let result = match args.transport {
        TransportKind::Stdio => stdio::serve(service.server.clone(), shutdown_signal()).await,
        TransportKind::Http => http::serve(&service, &config, token, shutdown_signal()).await,
    };
    manager.shutdown(SHUTDOWN_GRACE).await;
    drop(service);
    result.map(|_| 0)
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
