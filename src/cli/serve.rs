//! `codebox serve`: the MCP server on the application's run manager.

use std::path::PathBuf;
use std::sync::Arc;

use crate::app::App;
use crate::cluster::Cluster;
use crate::transport::{self, http, Transport};

/// The two MCP transports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    Stdio,
    Http,
}

/// `codebox serve` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// `stdio` (for a client that starts codebox itself) or `http` (Streamable HTTP at /mcp).
    #[arg(long, value_enum, default_value = "stdio")]
    pub transport: TransportKind,
    /// Address to listen on with `--transport http` (the `http.listen` setting; default
    /// 127.0.0.1:8765; port 0 picks one).
    #[arg(long)]
    pub listen: Option<String>,
    /// File holding the HTTP bearer token (beats CODEBOX_TOKEN, which beats the
    /// `http.token_file` setting).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// Serve HTTP without a token. Refused unless the listen address is loopback.
    #[arg(long)]
    pub no_auth: bool,
    /// Do not serve the console at `/` with `--transport http` (the `http.console` setting).
    #[arg(long)]
    pub no_console: bool,
    /// Print the effective configuration (as a config file; never the token) and exit.
    #[arg(long)]
    pub print_config: bool,
}

pub async fn serve(app: &App, args: ServeArgs) -> anyhow::Result<i32> {
    let mut config = (*app.config).clone();
    if args.no_console {
        config.http.console = false;
    }
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(0);
    }
    let transport = match args.transport {
        TransportKind::Stdio => Transport::Stdio,
        TransportKind::Http => Transport::Http {
            token: http::resolve_auth(
                &config.http,
                args.token_file.as_deref(),
                std::env::var("CODEBOX_TOKEN").ok(),
                args.no_auth,
            )?,
            // A shared history without the cluster settings is refused before anything starts.
            cluster: Cluster::for_http(&app.config, &app.instance.id)?.map(Arc::new),
        },
    };
    // Watch for signals before any container exists, so that none is left by one.
    let shutdown = transport::shutdown_signal();
    runtime_checks(app).await?;
    app.reap().await;
    // In a cluster, one queue for all the servers (SPEC section 15).
    if let Transport::Http {
        cluster: Some(cluster),
        ..
    } = &transport
    {
        if let Some(queue) =
            crate::history::SharedQueue::connect(&app.config.history_store(), &app.instance.id)
        {
            crate::cluster::dispatch::ClusterDispatch::join(&app.runs, queue, cluster.clone());
        }
    }
    app.runs.start_pool();
    app.sessions.start_ready();
    transport::serve(app.sessions.clone(), &config, transport, shutdown).await?;
    Ok(0)
}

/// Refuse to start when containers would not run under the runtime they ask for (Podman
/// gives every container its default), or when a container codebox lets out (an install
/// step, or programs under `sandbox.egress_hosts`) would run under a runtime that cannot
/// reach the egress proxy's Unix socket. A daemon that does not answer is left to the first
/// run to report.
async fn runtime_checks(app: &App) -> anyhow::Result<()> {
    let c = &app.config;
    let Ok(info) = app.engine.ping().await else {
        return Ok(());
    };
    super::check_runtimes(app, &info)?;
    let mut uses = Vec::new();
    if !c.sandbox.egress_hosts.is_empty() {
        uses.push(("sandbox.egress_hosts", c.sandbox.runtime.as_str(), ""));
    }
    if ["python", "javascript"]
        .iter()
        .any(|l| c.packages.index_for(l).is_some())
    {
        let runtime = c
            .packages
            .install_runtime
            .as_deref()
            .unwrap_or(&c.sandbox.runtime);
        uses.push((
            "packages",
            runtime,
            "; or set packages.install_runtime = \"runc\"",
        ));
    }
    for (setting, runtime, or) in uses {
        if let Some(problem) = info.host_uds_problem(runtime) {
            anyhow::bail!("{setting} is set, but {problem}{or}");
        }
    }
    Ok(())
}
