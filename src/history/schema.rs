//! Schema migrations, tracked in SQLite's `user_version`. Append, never edit: each entry
//! moves the schema from version `i` to `i + 1`.

use rusqlite::Connection;

const MIGRATIONS: &[&str] = &[
    // 1: one row per run.
    "CREATE TABLE runs (
        id                  TEXT PRIMARY KEY,
        instance            TEXT NOT NULL,
        created_at          INTEGER NOT NULL,   -- Unix ms
        started_at          INTEGER,
        ended_at            INTEGER,
        language            TEXT NOT NULL,
        image_id            TEXT,
        memory_mb           INTEGER NOT NULL,
        timeout_seconds     REAL NOT NULL,
        cpus                REAL NOT NULL,
        status              TEXT NOT NULL,
        stage               TEXT,
        exit_code           INTEGER,
        signal              TEXT,
        duration_ms         INTEGER,
        queued_ms           INTEGER,
        compile_duration_ms INTEGER,
        stdout_bytes        INTEGER,
        stderr_bytes        INTEGER,
        stdout_truncated    INTEGER,
        stderr_truncated    INTEGER,
        code_sha256         TEXT NOT NULL,
        code_bytes          INTEGER NOT NULL,
        code_preview        TEXT,
        message             TEXT
    );
    CREATE INDEX runs_by_time ON runs (created_at);
    CREATE INDEX runs_by_status ON runs (status);",
    // 2: the full final report (JSON), kept only for the retention period so that `get_result`
    // can answer for reports evicted from memory; the partial index finds the rows to clear.
    "ALTER TABLE runs ADD COLUMN report TEXT;
    CREATE INDEX runs_with_report ON runs (ended_at) WHERE report IS NOT NULL;",
];

/// Bring the database to the latest schema. A database newer than this binary is refused.
pub fn migrate(conn: &Connection) -> Result<(), rusqlite::Error> {
    let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
    let latest = MIGRATIONS.len() as i64;
    if version > latest {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "the history database has schema version {version}; this codebox knows up to {latest}"
        )));
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
        let tx = conn.unchecked_transaction()?;
        tx.execute_batch(sql)?;
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_idempotent_and_set_user_version() {
        let conn = Connection::open_in_memory().unwrap();
        migrate(&conn).unwrap();
        migrate(&conn).unwrap();
        let v: i64 = conn
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .unwrap();
        assert_eq!(v, MIGRATIONS.len() as i64);
    }

    #[test]
    fn a_version_1_database_gains_the_report_column() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        migrate(&conn).unwrap();
        let cols: Vec<String> = conn
            .prepare("SELECT name FROM pragma_table_info('runs')")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(cols.iter().any(|c| c == "report"), "{cols:?}");
    }
}
