//! Sessions in the store: when each was opened, by which instance, and why it ended, so that
//! a call naming a session this process does not hold is told the truth: it ended (and why),
//! another server holds it, or the server that held it is gone.

use super::db::{values, Database, DbError};

/// Why a session of a dead instance ended.
pub const RESTARTED: &str = "restarted";
/// Why a session of an instance whose lease lapsed ended.
pub const SERVER_STOPPED: &str = "server_stopped";

/// A session that was just opened.
#[derive(Debug, Clone)]
pub(crate) struct SessionOpened {
    pub session_id: String,
    pub language: String,
    pub instance: String,
    pub created_at_ms: i64,
}

/// What the store knows of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The instance that opened it.
    pub instance: String,
    /// That instance's host, if it ever sent a heartbeat.
    pub host: Option<String>,
    /// Milliseconds since that instance's last heartbeat.
    pub last_seen_ms_ago: Option<i64>,
    /// Why it ended (`closed`, `idle`, `lifetime`, `out_of_memory`, `failed`, `restarted`,
    /// `server_stopped`); `None` while its instance holds it.
    pub ended: Option<String>,
    /// How the other servers reach its instance (`cluster.advertise_url`), if it said.
    pub advertise_url: Option<String>,
}

pub fn opened(db: &mut dyn Database, s: &SessionOpened) -> Result<(), DbError> {
    db.execute(
        "INSERT INTO sessions (id, instance, language, created_at)
         VALUES (?1, ?2, ?3, ?4) ON CONFLICT (id) DO NOTHING",
        values![&s.session_id, &s.instance, &s.language, s.created_at_ms],
    )?;
    Ok(())
}

pub fn ended(db: &mut dyn Database, id: &str, reason: &str, at_ms: i64) -> Result<(), DbError> {
    db.execute(
        "UPDATE sessions SET ended_at = ?2, end_reason = ?3 WHERE id = ?1 AND ended_at IS NULL",
        values![id, at_ms, reason],
    )?;
    Ok(())
}

pub(crate) fn lookup(db: &mut dyn Database, id: &str) -> Result<Option<SessionRecord>, DbError> {
    let now = db.now_ms()?;
    let rows = db.query(
        "SELECT sessions.instance, instances.host, instances.heartbeat_at, sessions.end_reason,
                instances.advertise_url
         FROM sessions LEFT JOIN instances ON instances.id = sessions.instance
         WHERE sessions.id = ?1",
        values![id],
    )?;
    Ok(rows.first().map(|r| SessionRecord {
        instance: r.text(0).unwrap_or_default(),
        host: r.text(1),
        last_seen_ms_ago: r.int(2).map(|b| (now - b).max(0)),
        ended: r.text(3),
        advertise_url: r.text(4),
    }))
}

/// The sessions a dead instance left open ended when it did, for `reason` ([`RESTARTED`] or
/// [`SERVER_STOPPED`]).
pub(super) fn mark_ended_by(
    db: &mut dyn Database,
    instance: &str,
    at_ms: i64,
    reason: &str,
) -> Result<u64, DbError> {
    db.execute(
        "UPDATE sessions SET ended_at = ?2, end_reason = ?3
         WHERE instance = ?1 AND ended_at IS NULL",
        values![instance, at_ms, reason],
    )
}

/// The ids of the sessions that start with `prefix` (opened here, or named by a run), in
/// order, at most `limit`: `codebox history --session` takes a unique prefix.
pub(super) fn ids_starting_with(
    db: &mut dyn Database,
    prefix: &str,
    limit: i64,
) -> Result<Vec<String>, DbError> {
    let mut pattern = String::with_capacity(prefix.len() + 1);
    for c in prefix.chars() {
        if matches!(c, '\\' | '%' | '_') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    let rows = db.query(
        "SELECT id FROM sessions WHERE id LIKE ?1 ESCAPE '\\'
         UNION SELECT session_id FROM runs WHERE session_id LIKE ?1 ESCAPE '\\'
         ORDER BY 1 LIMIT ?2",
        values![pattern, limit],
    )?;
    Ok(rows
        .iter()
        .filter_map(|r| r.text(0))
        // SQLite's LIKE ignores ASCII case; ids are compared exactly.
        .filter(|id| id.starts_with(prefix))
        .collect())
}
