//! `codebox history`: the latest runs, as a table or as the `get_execution_history` JSON.

use std::io::Write;

use anyhow::bail;

use crate::app::App;
use crate::history::{HistoryResult, Query, MAX_QUERY_LIMIT};
use crate::report::Status;

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
    /// Only the executions of this session: its id (`cbx_...`, as `codebox repl` prints it)
    /// or a prefix of it that names one session only.
    #[arg(long)]
    pub session: Option<String>,
    /// Print `{"runs": [...]}`, the same object as the `get_execution_history` tool.
    #[arg(long)]
    pub json: bool,
}

pub async fn history(
    app: &App,
    args: HistoryArgs,
    out: &mut (dyn Write + Send),
) -> anyhow::Result<i32> {
    if !(1..=MAX_QUERY_LIMIT).contains(&args.limit) {
        bail!(
            "--limit: must be between 1 and {MAX_QUERY_LIMIT}; got {}",
            args.limit
        );
    }
    let status = match args.status.as_deref() {
        None => None,
        Some(s) => match Status::parse(s) {
            Some(s) => Some(s),
            None => bail!("--status: `{s}` is not a status"),
        },
    };
    let filtered = status.is_some() || args.language.is_some() || args.session.is_some();
    let language = args
        .language
        .map(|l| app.registry.resolve(&l).map_or(l, |lang| lang.id.clone()));
    let session_id = match args.session {
        Some(prefix) => Some(session(app, &prefix).await?),
        None => None,
    };
    let runs = app
        .history
        .query(Query {
            limit: Some(args.limit),
            status,
            language,
            session_id,
        })
        .await?;
    if args.json {
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&HistoryResult { runs })?
        )?;
        super::flush(out)?;
        return Ok(0);
    }
    let path = app.history.store();
    if runs.is_empty() {
        if filtered {
            writeln!(out, "(no matching runs in {path})")?;
        } else {
            writeln!(out, "no runs recorded yet in {path}")?;
        }
        super::flush(out)?;
        return Ok(0);
    }
    writeln!(
        out,
        "{:<32}  {:<24}  {:<10}  {:<13}  {:>9}  {:>5}  MESSAGE",
        "RUN ID", "CREATED (UTC)", "LANGUAGE", "STATUS", "DURATION", "EXIT"
    )?;
    for r in &runs {
        let created: String = r.created_at.chars().take(23).collect();
        let duration = r.duration_ms.map_or_else(
            || "-".to_string(),
            |d| format!("{:.2} s", d as f64 / 1000.0),
        );
        let exit = r
            .exit_code
            .map_or_else(|| "-".to_string(), |c| c.to_string());
        let mut message: String = r.message.chars().take(60).collect();
        if !r.status.is_terminal() {
            message = format!("{message} [{}]", owner(app, r).await);
        }
        if let (Some(s), Some(n)) = (&r.session_id, r.execution_count) {
            let tag: String = s.chars().take(10).collect();
            message = format!("[{tag}… #{n}] {message}");
        }
        writeln!(
            out,
            "{:<32}  {:<24}  {:<10}  {:<13}  {:>9}  {:>5}  {}",
            r.run_id,
            created,
            r.language,
            r.status.as_str(),
            duration,
            exit,
            message
        )?;
    }
    super::flush(out)?;
    Ok(0)
}

/// The one session whose id starts with `prefix`; an error when none or several do.
async fn session(app: &App, prefix: &str) -> anyhow::Result<String> {
    let store = app.history.store();
    if prefix.trim().is_empty() {
        bail!("--session: give a session id (`cbx_...`) or the start of one");
    }
    let ids = app.history.session_ids(prefix, 6).await?;
    match ids.as_slice() {
        [] => bail!(
            "--session: no session id starts with `{prefix}` in {store}; the ids are in `codebox history` (MESSAGE column) and `codebox repl` prints its own"
        ),
        [one] => Ok(one.clone()),
        many => bail!(
            "--session: `{prefix}` is the start of {} session ids ({}{}); give more of the id",
            if many.len() > 5 { "more than 5".to_string() } else { many.len().to_string() },
            many.iter().take(5).cloned().collect::<Vec<_>>().join(", "),
            if many.len() > 5 { ", ..." } else { "" }
        ),
    }
}

/// Which process holds a run still in flight, as far as this process can tell: its instance
/// id, and whether it is alive (its lock file, on this host and data directory) or when it
/// was last heard from (its heartbeat, from another host).
async fn owner(app: &App, row: &crate::history::HistoryRow) -> String {
    use crate::instance::{Instance, Liveness};
    let id: String = row.instance.chars().take(12).collect();
    if row.instance == app.instance.id {
        return format!("in flight in this process ({id})");
    }
    match Instance::liveness(&app.config.data_dir, &row.instance) {
        Liveness::Alive => format!("in flight in codebox process {id}, alive on this host"),
        Liveness::Dead => format!(
            "codebox process {id} is gone; the next codebox to start marks this run interrupted"
        ),
        Liveness::Unknown => match app.history.whereabouts(&row.run_id).await {
            Ok(Some(w)) => format!(
                "in flight in codebox process {id} on {}, last heard from {}",
                w.host.as_deref().unwrap_or("an unknown host"),
                w.last_seen_ms_ago
                    .map_or_else(|| "never".to_string(), |ms| format!("{} s ago", ms / 1000))
            ),
            _ => format!("in flight in codebox process {id}"),
        },
    }
}
