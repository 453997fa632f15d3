//! `codebox history`: the latest runs, as a table or as the `get_execution_history` JSON.

use crate::config::Config;
use crate::registry::Registry;
use crate::report::Status;

use super::{History, HistoryError, Query, MAX_QUERY_LIMIT};

/// `codebox history` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct HistoryArgs {
    /// Most runs to show, newest first (1 to 1000).
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Only runs with this status (e.g. failed, timed_out).
    #[arg(long)]
    pub status: Option<String>,
    /// Only runs of this language (id or alias).
    #[arg(long)]
    pub language: Option<String>,
    /// Print `{"runs": [...]}`, the same object as the `get_execution_history` tool.
    #[arg(long)]
    pub json: bool,
}

/// Why `codebox history` failed.
#[derive(Debug, thiserror::Error)]
pub enum HistoryCommandError {
    #[error("--{0}")]
    Argument(String),
    #[error(transparent)]
    History(#[from] HistoryError),
    #[error("cannot print JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Print the history; returns the exit status.
pub async fn run(
    config: &Config,
    registry: &Registry,
    instance: &str,
    args: HistoryArgs,
) -> Result<i32, HistoryCommandError> {
    if !(1..=MAX_QUERY_LIMIT).contains(&args.limit) {
        return Err(HistoryCommandError::Argument(format!(
            "limit: must be between 1 and {MAX_QUERY_LIMIT}; got {}",
            args.limit
        )));
    }
    let status = match args.status.as_deref() {
        None => None,
        Some(s) => Some(Status::parse(s).ok_or_else(|| {
            HistoryCommandError::Argument(format!("status: `{s}` is not a status"))
        })?),
    };
    let language = args
        .language
        .map(|l| registry.resolve(&l).map_or(l, |lang| lang.id.clone()));
    let path = config.history_path();
    if !path.exists() {
        if args.json {
            println!("{{\n  \"runs\": []\n}}");
        } else {
            println!("no runs recorded yet ({} does not exist)", path.display());
        }
        return Ok(0);
    }
    let _ = instance;
    let history = History::open_for_reading(&path);
    let runs = history
        .query(Query {
            limit: Some(args.limit),
            status,
            language,
        })
        .await?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&super::super::mcp::HistoryResult { runs })?
        );
        return Ok(0);
    }
    println!(
        "{:<32}  {:<24}  {:<10}  {:<13}  {:>9}  {:>5}  MESSAGE",
        "RUN ID", "CREATED (UTC)", "LANGUAGE", "STATUS", "DURATION", "EXIT"
    );
    for r in &runs {
        let created: String = r.created_at.chars().take(23).collect();
        let duration = r.duration_ms.map_or_else(
            || "-".to_string(),
            |d| format!("{:.2} s", d as f64 / 1000.0),
        );
        let exit = r
            .exit_code
            .map_or_else(|| "-".to_string(), |c| c.to_string());
        let message: String = r.message.chars().take(60).collect();
        println!(
            "{:<32}  {:<24}  {:<10}  {:<13}  {:>9}  {:>5}  {}",
            r.run_id,
            created,
            r.language,
            r.status.as_str(),
            duration,
            exit,
            message
        );
    }
    if runs.is_empty() {
        println!("(no matching runs in {})", path.display());
    }
    Ok(0)
}
