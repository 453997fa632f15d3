//! Schema migrations: one list, whose SQL both SQLite and PostgreSQL accept, applied in one
//! exclusive transaction at open. The version lives in SQLite's `user_version`, and in
//! PostgreSQL in a one-row table `codebox_schema`. Append, never edit: each entry moves the
//! schema from version `i` to `i + 1`.
//!
//! Types are written as both dialects read them: `BIGINT` (SQLite: INTEGER affinity;
//! PostgreSQL: 64 bits, which Unix milliseconds need), `DOUBLE PRECISION` (SQLite: REAL
//! affinity), `TEXT`. Booleans are `BIGINT` 0 or 1. (Migration 1 first said `INTEGER` and
//! `REAL`; for SQLite those are the same affinities, so SQLite databases made before are the
//! same schema, which a test below checks, and PostgreSQL gets the sizes it needs.)

use super::db::{exclusive, Database, DbError};

const MIGRATIONS: &[&str] = &[
    // 1: one row per run.
    "CREATE TABLE runs (
        id                  TEXT PRIMARY KEY,
        instance            TEXT NOT NULL,
        created_at          BIGINT NOT NULL,   -- Unix ms
        started_at          BIGINT,
        ended_at            BIGINT,
        language            TEXT NOT NULL,
        image_id            TEXT,
        memory_mb           BIGINT NOT NULL,
        timeout_seconds     DOUBLE PRECISION NOT NULL,
        cpus                DOUBLE PRECISION NOT NULL,
        status              TEXT NOT NULL,
        stage               TEXT,
        exit_code           BIGINT,
        signal              TEXT,
        duration_ms         BIGINT,
        queued_ms           BIGINT,
        compile_duration_ms BIGINT,
        stdout_bytes        BIGINT,
        stderr_bytes        BIGINT,
        stdout_truncated    BIGINT,
        stderr_truncated    BIGINT,
        code_sha256         TEXT NOT NULL,
        code_bytes          BIGINT NOT NULL,
        code_preview        TEXT,
        message             TEXT
    );
    CREATE INDEX runs_by_time ON runs (created_at);
    CREATE INDEX runs_by_status ON runs (status);",
    // 2: the full final report (JSON), kept only for the retention period so that `get_result`
    // can answer for reports evicted from memory; the partial index finds the rows to clear.
    "ALTER TABLE runs ADD COLUMN report TEXT;
    CREATE INDEX runs_with_report ON runs (ended_at) WHERE report IS NOT NULL;",
    // 3: several servers on one store. `seq` orders runs accepted in the same millisecond
    // (null on rows from before); `instances` holds each codebox process's heartbeat, by which
    // a server on another host is judged alive or dead.
    "ALTER TABLE runs ADD COLUMN seq BIGINT;
    CREATE INDEX runs_by_seq ON runs (seq);
    CREATE TABLE instances (
        id           TEXT PRIMARY KEY,
        host         TEXT NOT NULL,
        pid          BIGINT NOT NULL,
        started_at   BIGINT NOT NULL,   -- Unix ms, the database's clock
        heartbeat_at BIGINT NOT NULL    -- Unix ms, the database's clock
    );",
    // 4: sessions. Each execution's row names its session and its place in it; `sessions`
    // says who opened each session and why it ended, for calls that name it later.
    "ALTER TABLE runs ADD COLUMN session_id TEXT;
    ALTER TABLE runs ADD COLUMN execution_count BIGINT;
    CREATE INDEX runs_by_session ON runs (session_id);
    CREATE TABLE sessions (
        id          TEXT PRIMARY KEY,
        instance    TEXT NOT NULL,
        language    TEXT NOT NULL,
        created_at  BIGINT NOT NULL,   -- Unix ms
        ended_at    BIGINT,
        end_reason  TEXT
    );",
    // 5: several servers as one (SPEC section 15): how the others reach each instance.
    "ALTER TABLE instances ADD COLUMN advertise_url TEXT;",
    // 6: packages on request (SPEC 13): what a run asked for and how it was installed (the
    // report's `packages`, JSON), kept past the report's retention like the other columns.
    "ALTER TABLE runs ADD COLUMN packages TEXT;",
    // 7: one queue for the servers sharing a PostgreSQL history (SPEC section 15): a row per
    // run submitted and not started yet, claimed in `seq` order (the database's clock, in
    // microseconds) by the server that runs it. `request` is the run request (JSON), `base`
    // the report it would have had it never started (JSON), `slots` and `charge_mb` what it
    // takes of a server. Unused with SQLite.
    "CREATE TABLE queue (
        run_id       TEXT PRIMARY KEY,
        seq          BIGINT NOT NULL,
        submitted_by TEXT NOT NULL,
        created_at   BIGINT NOT NULL,   -- Unix ms, the database's clock
        request      TEXT NOT NULL,
        base         TEXT NOT NULL,
        slots        BIGINT NOT NULL,
        charge_mb    BIGINT NOT NULL,
        claimed_by   TEXT,
        claimed_at   BIGINT,
        handed_back  BIGINT NOT NULL DEFAULT 0
    );
    CREATE INDEX queue_unclaimed ON queue (seq) WHERE claimed_by IS NULL;
    CREATE INDEX queue_by_claimer ON queue (claimed_by);",
    // 8: fencing (SPEC section 15). When a lease judge finds an instance's lease lapsed it
    // records its verdict here (Unix ms, the database's clock) in the transaction that marks
    // what the instance held; that instance's next renewal finds it and re-joins.
    "ALTER TABLE instances ADD COLUMN lapsed_at BIGINT;",
];

/// The schema version this codebox writes.
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Bring the database to the latest schema. A database newer than this binary is refused.
/// Servers starting together against one database migrate one after the other.
pub(super) fn migrate(db: &mut dyn Database) -> Result<(), DbError> {
    exclusive(db, |db| {
        let version = db.schema_version()?;
        if version > SCHEMA_VERSION {
            return Err(DbError::Schema(format!(
                "the history database has schema version {version}; this codebox knows up to {SCHEMA_VERSION}"
            )));
        }
        for sql in &MIGRATIONS[version.max(0) as usize..] {
            db.batch(sql)?;
        }
        if version < SCHEMA_VERSION {
            db.set_schema_version(SCHEMA_VERSION)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::super::sqlite::Sqlite;
    use super::*;

    /// Migration 1 as it was first written (SQLite-only type names).
    const FIRST_MIGRATION_1: &str = "CREATE TABLE runs (
        id TEXT PRIMARY KEY, instance TEXT NOT NULL, created_at INTEGER NOT NULL,
        started_at INTEGER, ended_at INTEGER, language TEXT NOT NULL, image_id TEXT,
        memory_mb INTEGER NOT NULL, timeout_seconds REAL NOT NULL, cpus REAL NOT NULL,
        status TEXT NOT NULL, stage TEXT, exit_code INTEGER, signal TEXT, duration_ms INTEGER,
        queued_ms INTEGER, compile_duration_ms INTEGER, stdout_bytes INTEGER,
        stderr_bytes INTEGER, stdout_truncated INTEGER, stderr_truncated INTEGER,
        code_sha256 TEXT NOT NULL, code_bytes INTEGER NOT NULL, code_preview TEXT,
        message TEXT
    );
    CREATE INDEX runs_by_time ON runs (created_at);
    CREATE INDEX runs_by_status ON runs (status);";

    /// SQLite's affinity of a declared type (section 3.1 of its datatype documentation).
    fn affinity(declared: &str) -> &'static str {
        let t = declared.to_ascii_uppercase();
        if t.contains("INT") {
            "INTEGER"
        } else if t.contains("CHAR") || t.contains("CLOB") || t.contains("TEXT") {
            "TEXT"
        } else if t.contains("BLOB") || t.is_empty() {
            "BLOB"
        } else if t.contains("REAL") || t.contains("FLOA") || t.contains("DOUB") {
            "REAL"
        } else {
            "NUMERIC"
        }
    }

    fn columns(db: &Sqlite) -> Vec<(String, &'static str, bool, bool)> {
        db.connection()
            .prepare("SELECT name, type, \"notnull\", pk FROM pragma_table_info('runs')")
            .unwrap()
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    affinity(&r.get::<_, String>(1)?),
                    r.get::<_, bool>(2)?,
                    r.get::<_, bool>(3)?,
                ))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    #[test]
    fn migrations_are_idempotent_and_set_the_version() {
        let mut db = Sqlite::in_memory().unwrap();
        migrate(&mut db).unwrap();
        migrate(&mut db).unwrap();
        assert_eq!(db.schema_version().unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn a_version_1_database_gains_the_later_columns_and_tables() {
        let mut db = Sqlite::in_memory().unwrap();
        db.batch(FIRST_MIGRATION_1).unwrap();
        db.set_schema_version(1).unwrap();
        migrate(&mut db).unwrap();
        let cols: Vec<String> = columns(&db).into_iter().map(|c| c.0).collect();
        assert!(
            cols.iter().any(|c| c == "report") && cols.iter().any(|c| c == "seq"),
            "{cols:?}"
        );
        assert_eq!(
            db.query("SELECT COUNT(*) FROM instances", &[]).unwrap()[0].int(0),
            Some(0)
        );
    }

    #[test]
    fn the_portable_first_migration_is_the_same_sqlite_schema_as_the_first_one() {
        let old = Sqlite::in_memory().unwrap();
        old.connection().execute_batch(FIRST_MIGRATION_1).unwrap();
        let mut new = Sqlite::in_memory().unwrap();
        new.batch(MIGRATIONS[0]).unwrap();
        assert_eq!(columns(&old), columns(&new));
    }

    #[test]
    fn a_database_newer_than_this_codebox_is_refused() {
        let mut db = Sqlite::in_memory().unwrap();
        db.set_schema_version(SCHEMA_VERSION + 1).unwrap();
        let err = migrate(&mut db).unwrap_err().to_string();
        assert!(err.contains("schema version"), "{err}");
    }
}
