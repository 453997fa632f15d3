//! What the history does with its database, written once for both backends: the rows of runs,
//! the stored reports, the instances' heartbeats, and marking the runs of dead instances.

use super::db::{transaction, values, Database, DbError, Row};
use super::{
    now_ms, HistoryRow, NewRun, Owner, Query, Whereabouts, DEFAULT_QUERY_LIMIT,
    INTERRUPTED_MESSAGE, MAX_QUERY_LIMIT, STOPPED_ANSWERING_MESSAGE,
};
use crate::instance::{Instance, Liveness};
use crate::report::{RunLimits, RunReport, Stage, Status};

/// How long an instance's row is kept after its last heartbeat.
const FORGET_INSTANCES_AFTER_MS: i64 = 24 * 3600 * 1000;

/// Bring the schema up to date, announce this instance (`joined`: it did before, and renews),
/// mark what dead instances left unfinished, and forget instances long gone. `Ok(false)`:
/// this instance's lease was judged lapsed meanwhile ([`heartbeat`]).
pub fn prepare(
    db: &mut dyn Database,
    owner: &Owner,
    judge_leases: bool,
    joined: bool,
) -> Result<bool, DbError> {
    super::schema::migrate(db)?;
    let now = db.now_ms()?;
    let alive = heartbeat(db, owner, now, joined)?;
    mark_interrupted(db, owner, now, judge_leases)?;
    db.execute(
        "DELETE FROM instances WHERE heartbeat_at < ?1",
        values![now - FORGET_INSTANCES_AFTER_MS],
    )?;
    Ok(alive)
}

/// Record that this instance is alive, by the database's clock `now`: its first heartbeat
/// (`joined` false) writes its row; a renewal succeeds only while no judge found its lease
/// lapsed (`lapsed_at`, written under the row's lock in the judge's transaction, so that a
/// renewal and a verdict never both win). `Ok(false)`: a judge did (or the row was forgotten
/// after a day of silence), so what this instance held was marked and handed on by the
/// others: it must stop what it holds and [`rejoin`].
pub fn heartbeat(
    db: &mut dyn Database,
    owner: &Owner,
    now: i64,
    joined: bool,
) -> Result<bool, DbError> {
    if joined {
        let renewed = db.execute(
            "UPDATE instances SET heartbeat_at = ?2 WHERE id = ?1 AND lapsed_at IS NULL",
            values![&owner.instance, now],
        )?;
        return Ok(renewed > 0);
    }
    join(db, owner, now)?;
    Ok(true)
}

/// Write this instance's row afresh, lease renewed and no verdict.
fn join(db: &mut dyn Database, owner: &Owner, now: i64) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO instances (id, host, pid, started_at, heartbeat_at, advertise_url)
         VALUES (?1, ?2, ?3, ?4, ?4, ?5)
         ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, lapsed_at = NULL",
        values![
            &owner.instance,
            crate::instance::hostname(),
            i64::from(std::process::id()),
            now,
            owner.advertise_url.as_deref()
        ],
    )?;
    Ok(())
}

/// This instance, judged lapsed, takes a fresh lease (its verdict cleared): from now on the
/// others take it for alive again, and what it holds from now on is its own.
pub(super) fn rejoin(db: &mut dyn Database, owner: &Owner) -> Result<(), DbError> {
    let now = db.now_ms()?;
    join(db, owner, now)
}

/// How an instance is known to be gone.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Gone {
    /// Its lock file (same host, same data directory) says it exited: restarted.
    Restarted,
    /// Its lease lapsed: it stopped answering.
    Lapsed,
}

/// Whether instance `id` is dead, as far as `owner` can tell: its lock file in `owner`'s data
/// directory decides when there is one (the same host and data directory); otherwise its
/// heartbeat, which must be younger than the lease (`owner.lease`) by the database's clock
/// `now`. An instance with neither (rows written before heartbeats existed) is dead.
fn is_dead(
    db: &mut dyn Database,
    owner: &Owner,
    id: &str,
    now: i64,
    judge_leases: bool,
) -> Result<Option<Gone>, DbError> {
    if id == owner.instance {
        return Ok(None);
    }
    Ok(match Instance::liveness(&owner.data_dir, id) {
        Liveness::Alive => None,
        Liveness::Dead => Some(Gone::Restarted),
        Liveness::Unknown if !judge_leases => None,
        Liveness::Unknown => {
            // The verdict is written on the instance's row, under its lock: a renewal that
            // came first makes this find the lease current; one that comes after finds the
            // verdict and fences its server ([`heartbeat`]).
            let lapsed = db.execute(
                "UPDATE instances SET lapsed_at = COALESCE(lapsed_at, ?2)
                 WHERE id = ?1 AND (lapsed_at IS NOT NULL OR heartbeat_at < ?3)",
                values![id, now, now - owner.lease.as_millis() as i64],
            )?;
            if lapsed > 0 {
                Some(Gone::Lapsed)
            } else {
                let known = db.query("SELECT 1 FROM instances WHERE id = ?1", values![id])?;
                known.is_empty().then_some(Gone::Restarted)
            }
        }
    })
}

/// Mark the unfinished runs of dead instances `sandbox_error` ("interrupted by server
/// restart", or "its server stopped answering" when its lease lapsed) and end their sessions;
/// the runs of living instances, on this host or another, are left alone. Without
/// `judge_leases` only instances known dead by their lock files are.
///
/// Runs in the shared queue are not lost with a server: those a dead instance had claimed
/// but not started go back to the queue (once: the row is unclaimed by whichever judge gets
/// there first), and unclaimed ones are never marked. One server judges at a time (an
/// advisory lock); the others skip the round.
pub(super) fn mark_interrupted(
    db: &mut dyn Database,
    owner: &Owner,
    now: i64,
    judge_leases: bool,
) -> Result<u64, DbError> {
    transaction(db, |db| {
        if !db.try_advisory_xact_lock(super::JUDGE_LOCK)? {
            return Ok(0);
        }
        mark_interrupted_locked(db, owner, now, judge_leases)
    })
}

fn mark_interrupted_locked(
    db: &mut dyn Database,
    owner: &Owner,
    now: i64,
    judge_leases: bool,
) -> Result<u64, DbError> {
    let instances: Vec<String> = db
        .query(
            "SELECT DISTINCT instance FROM runs WHERE status IN ('queued', 'running')
             UNION SELECT DISTINCT instance FROM sessions WHERE ended_at IS NULL
             UNION SELECT DISTINCT claimed_by FROM queue WHERE claimed_by IS NOT NULL",
            &[],
        )?
        .iter()
        .filter_map(|r| r.text(0))
        .collect();
    let mut marked = 0;
    for instance in instances {
        let Some(gone) = is_dead(db, owner, &instance, now, judge_leases)? else {
            continue;
        };
        let message = match gone {
            Gone::Restarted => INTERRUPTED_MESSAGE,
            Gone::Lapsed => STOPPED_ANSWERING_MESSAGE,
        };
        // What it claimed: started (or ended) runs leave the queue and are judged below;
        // the others go back to it.
        db.execute(
            "DELETE FROM queue WHERE claimed_by = ?1
             AND run_id IN (SELECT id FROM runs WHERE status <> 'queued')",
            values![&instance],
        )?;
        let back = db.execute(
            "UPDATE queue SET claimed_by = NULL, claimed_at = NULL,
                handed_back = handed_back + 1
             WHERE claimed_by = ?1",
            values![&instance],
        )?;
        if back > 0 {
            db.notify(super::QUEUE_CHANNEL, "")?;
            tracing::warn!(
                runs = back,
                instance,
                "a server that is gone had claimed runs it had not started: they are back in the shared queue"
            );
        }
        let runs = db.query(
            "SELECT id, language, memory_mb, timeout_seconds, cpus, created_at, started_at
             FROM runs WHERE instance = ?1 AND status IN ('queued', 'running')
             AND id NOT IN (SELECT run_id FROM queue)",
            values![&instance],
        )?;
        let mut n = 0;
        for run in &runs {
            let report = interrupted_report(run, message);
            let json = serde_json::to_string(&report).ok();
            // Only if still unfinished: another server may be marking the same rows.
            let changed = db.execute(
                "UPDATE runs SET status = 'sandbox_error', message = ?1, ended_at = ?2,
                    report = ?3
                 WHERE id = ?4 AND status IN ('queued', 'running')",
                values![message, now_ms(), json, &report.run_id],
            )?;
            if changed > 0 {
                db.notify(super::MOVED_CHANNEL, &report.run_id)?;
            }
            n += changed;
        }
        let reason = match gone {
            Gone::Restarted => super::sessions::RESTARTED,
            Gone::Lapsed => super::sessions::SERVER_STOPPED,
        };
        super::sessions::mark_ended_by(db, &instance, now, reason)?;
        if n > 0 {
            tracing::warn!(
                runs = n,
                instance,
                "marked runs of a server that is gone as sandbox_error ({message})"
            );
        }
        marked += n;
    }
    Ok(marked)
}

/// The final report of a run whose server died, from its row (`id, language, memory_mb,
/// timeout_seconds, cpus, created_at, started_at`): stored like any other, so that every
/// server sharing the database answers `get_result` for it.
fn interrupted_report(row: &Row, message: &str) -> RunReport {
    let mut r = RunReport::new(
        row.text(0).unwrap_or_default(),
        row.text(1).unwrap_or_default(),
        Status::SandboxError,
        RunLimits {
            memory_mb: row.int(2).unwrap_or(0).max(0) as u64,
            timeout_seconds: row.real(3).unwrap_or(0.0),
            cpus: row.real(4).unwrap_or(0.0),
        },
        message,
    );
    r.queued_ms = match (row.int(5), row.int(6)) {
        (Some(created), Some(started)) => (started - created).max(0) as u64,
        _ => 0,
    };
    r
}

pub fn insert(db: &mut dyn Database, r: &NewRun) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO runs (id, instance, created_at, language, memory_mb, timeout_seconds, cpus,
            status, code_sha256, code_bytes, code_preview, message, seq, session_id,
            execution_count)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 'queued', ?8, ?9, ?10, 'waiting for a free slot',
            (SELECT COALESCE(MAX(seq), 0) + 1 FROM runs), ?11, ?12)
         ON CONFLICT (id) DO NOTHING",
        values![
            &r.run_id,
            &r.instance,
            r.created_at_ms,
            &r.language,
            r.limits.memory_mb,
            r.limits.timeout_seconds,
            r.limits.cpus,
            &r.code_sha256,
            r.code_bytes,
            r.code_preview.clone(),
            r.session.as_ref().map(|(id, _)| id.clone()),
            r.session.as_ref().map(|(_, n)| *n as i64),
        ],
    )?;
    Ok(())
}

pub fn started(db: &mut dyn Database, run_id: &str, at_ms: i64) -> Result<(), DbError> {
    db.execute(
        "UPDATE runs SET status = 'running', started_at = ?2, message = 'started; not finished yet' WHERE id = ?1 AND status = 'queued'",
        values![run_id, at_ms],
    )?;
    Ok(())
}

/// The report as the history keeps it: returned files by name, size and hash, never their
/// content.
fn without_file_contents(r: &RunReport) -> RunReport {
    let mut r = r.clone();
    for f in &mut r.files {
        if f.content_base64.take().is_some() {
            f.omitted_reason = Some("not kept by the history".to_string());
        }
    }
    r
}

/// Record a run's final report, unless it has one already: the first final report wins. A
/// server that only looked dead (paused, cut off) reports late, after a lease judge wrote
/// `sandbox_error` "its server stopped answering" for its run; that late report is dropped
/// (logged), so that every run has one final report, the one the others answered with.
pub fn finish(db: &mut dyn Database, r: &RunReport, at_ms: i64) -> Result<(), DbError> {
    let json = serde_json::to_string(&without_file_contents(r))
        .map_err(|e| tracing::warn!(run_id = r.run_id, error = %e, "cannot store a run's report"))
        .ok();
    let written = db.execute(
        "UPDATE runs SET status = ?2, stage = ?3, exit_code = ?4, signal = ?5, image_id = ?6,
            duration_ms = ?7, queued_ms = ?8, compile_duration_ms = ?9,
            stdout_bytes = ?10, stderr_bytes = ?11, stdout_truncated = ?12, stderr_truncated = ?13,
            message = ?14, ended_at = ?15, report = ?16, packages = ?17
         WHERE id = ?1 AND status IN ('queued', 'running')",
        values![
            &r.run_id,
            r.status.as_str(),
            r.stage.map(Stage::as_str),
            r.exit_code,
            r.signal.clone(),
            r.image_id.clone(),
            r.duration_ms,
            r.queued_ms,
            r.compile.as_ref().map(|c| c.duration_ms),
            r.stdout_bytes,
            r.stderr_bytes,
            r.stdout_truncated,
            r.stderr_truncated,
            &r.message,
            at_ms,
            json,
            r.packages
                .as_ref()
                .and_then(|p| serde_json::to_string(p).ok()),
        ],
    )?;
    if written == 0 {
        let had = db.query(
            "SELECT status, message FROM runs WHERE id = ?1",
            values![&r.run_id],
        )?;
        if let Some(row) = had.first() {
            tracing::warn!(
                run_id = r.run_id,
                late = r.status.as_str(),
                kept = row.text(0).unwrap_or_default(),
                kept_message = row.text(1).unwrap_or_default(),
                "a run's final report came after another was written for it (its server was judged gone meanwhile); the first stands and this one is dropped"
            );
        }
        return Ok(());
    }
    // A server waiting on a run it does not hold looks again (PostgreSQL only).
    db.notify(super::MOVED_CHANNEL, &r.run_id)
}

pub fn forget_reports(db: &mut dyn Database, run_ids: &[String]) -> Result<(), DbError> {
    transaction(db, |db| {
        for id in run_ids {
            db.execute(
                "UPDATE runs SET report = NULL WHERE id = ?1 AND report IS NOT NULL",
                values![id],
            )?;
        }
        Ok(())
    })
}

pub(crate) fn forget_reports_ended_before(
    db: &mut dyn Database,
    cutoff_ms: i64,
) -> Result<(), DbError> {
    db.execute(
        "UPDATE runs SET report = NULL WHERE report IS NOT NULL AND ended_at < ?1",
        values![cutoff_ms],
    )?;
    Ok(())
}

/// A finished run's stored report (JSON), if it is still kept (and ended at or after
/// `ended_after_ms`, when given).
pub(crate) fn stored_report(
    db: &mut dyn Database,
    run_id: &str,
    ended_after_ms: Option<i64>,
) -> Result<Option<String>, DbError> {
    let rows = db.query(
        "SELECT report FROM runs
         WHERE id = ?1 AND report IS NOT NULL AND ended_at >= ?2",
        values![run_id, ended_after_ms.unwrap_or(i64::MIN)],
    )?;
    Ok(rows.first().and_then(|r| r.text(0)))
}

const COLUMNS: &str = "id, created_at, started_at, ended_at, language, image_id, memory_mb, timeout_seconds,
    cpus, status, stage, exit_code, signal, duration_ms, queued_ms, compile_duration_ms, stdout_bytes,
    stderr_bytes, stdout_truncated, stderr_truncated, code_sha256, code_bytes, code_preview, message,
    instance, session_id, execution_count, packages";

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}

fn history_row(r: &Row) -> HistoryRow {
    let count = |i: usize| r.int(i).map(|v| v.max(0) as u64);
    HistoryRow {
        run_id: r.text(0).unwrap_or_default(),
        created_at: r.int(1).map(rfc3339).unwrap_or_default(),
        started_at: r.int(2).map(rfc3339),
        ended_at: r.int(3).map(rfc3339),
        language: r.text(4).unwrap_or_default(),
        image_id: r.text(5),
        limits: RunLimits {
            memory_mb: count(6).unwrap_or(0),
            timeout_seconds: r.real(7).unwrap_or(0.0),
            cpus: r.real(8).unwrap_or(0.0),
        },
        status: r
            .text(9)
            .and_then(|s| Status::parse(&s))
            .unwrap_or(Status::SandboxError),
        stage: r.text(10).and_then(|s| match s.as_str() {
            "install" => Some(Stage::Install),
            "compile" => Some(Stage::Compile),
            "run" => Some(Stage::Run),
            _ => None,
        }),
        exit_code: r.int(11),
        signal: r.text(12),
        duration_ms: count(13),
        queued_ms: count(14),
        compile_duration_ms: count(15),
        stdout_bytes: count(16).unwrap_or(0),
        stderr_bytes: count(17).unwrap_or(0),
        stdout_truncated: r.int(18).is_some_and(|v| v != 0),
        stderr_truncated: r.int(19).is_some_and(|v| v != 0),
        code_sha256: r.text(20).unwrap_or_default(),
        code_bytes: count(21).unwrap_or(0),
        code_preview: r.text(22),
        message: r.text(23).unwrap_or_default(),
        instance: r.text(24).unwrap_or_default(),
        session_id: r.text(25),
        execution_count: count(26),
        packages: r.text(27).and_then(|j| serde_json::from_str(&j).ok()),
    }
}

/// Rows matching `q`, newest first (runs accepted in the same millisecond: the later first).
pub(crate) fn select(db: &mut dyn Database, q: &Query) -> Result<Vec<HistoryRow>, DbError> {
    let limit = q
        .limit
        .unwrap_or(DEFAULT_QUERY_LIMIT)
        .clamp(1, MAX_QUERY_LIMIT) as i64;
    let sql = format!(
        "SELECT {COLUMNS} FROM runs
         WHERE (?1 = '' OR status = ?1) AND (?2 = '' OR language = ?2)
            AND (?4 = '' OR session_id = ?4)
         ORDER BY created_at DESC, seq DESC LIMIT ?3"
    );
    let rows = db.query(
        &sql,
        values![
            q.status.map_or("", Status::as_str),
            q.language.as_deref().unwrap_or(""),
            limit,
            q.session_id.as_deref().unwrap_or("")
        ],
    )?;
    Ok(rows.iter().map(history_row).collect())
}

pub fn get(db: &mut dyn Database, run_id: &str) -> Result<Option<HistoryRow>, DbError> {
    let sql = format!("SELECT {COLUMNS} FROM runs WHERE id = ?1");
    Ok(db.query(&sql, values![run_id])?.first().map(history_row))
}

/// Where a run stands in the store, and which instance has it.
pub fn whereabouts(db: &mut dyn Database, run_id: &str) -> Result<Option<Whereabouts>, DbError> {
    let now = db.now_ms()?;
    let rows = db.query(
        "SELECT runs.status, runs.instance, instances.host, instances.heartbeat_at,
                instances.advertise_url,
                CASE WHEN queue.run_id IS NOT NULL AND queue.claimed_by IS NULL
                     THEN 1 ELSE 0 END
         FROM runs LEFT JOIN instances ON instances.id = runs.instance
                   LEFT JOIN queue ON queue.run_id = runs.id
         WHERE runs.id = ?1",
        values![run_id],
    )?;
    Ok(rows.first().map(|r| Whereabouts {
        run_id: run_id.to_string(),
        status: r
            .text(0)
            .and_then(|s| Status::parse(&s))
            .unwrap_or(Status::SandboxError),
        instance: r.text(1).unwrap_or_default(),
        host: r.text(2),
        last_seen_ms_ago: r.int(3).map(|b| (now - b).max(0)),
        advertise_url: r.text(4),
        unclaimed: r.int(5) == Some(1),
    }))
}
